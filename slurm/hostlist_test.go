package slurm

import (
	"reflect"
	"testing"
)

func TestExpandNodeList(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{"", nil, false},
		{"(null)", nil, false},
		{"n1", []string{"n1"}, false},
		{"n[1-3]", []string{"n1", "n2", "n3"}, false},
		{"gpu[08-10]", []string{"gpu08", "gpu09", "gpu10"}, false},
		{"n[1,3-4],login", []string{"n1", "n3", "n4", "login"}, false},
		{"r[1-2]n[1-2]", []string{"r1n1", "r1n2", "r2n1", "r2n2"}, false},
		{"a[1-2]-ib", []string{"a1-ib", "a2-ib"}, false},
		{"n[3-1]", nil, true},
		{"n[1-2", nil, true},
		{"n1]", nil, true},
		{"n[x]", nil, true},
	}
	for _, tt := range tests {
		got, err := ExpandNodeList(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ExpandNodeList(%q) = %v, %v; want %v (error %v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
