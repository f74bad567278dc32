package k8s

import (
	"reflect"
	"testing"
)

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want Env
	}{
		{"outside kubernetes", nil, Env{CompletionIndex: -1, PodOrdinal: -1}},
		{"indexed job pod", map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "2", "HOSTNAME": "train-2-x7k2p"},
			Env{InPod: true, CompletionIndex: 2, Hostname: "train-2-x7k2p", PodOrdinal: -1}},
		{"statefulset pod", map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-12"},
			Env{InPod: true, CompletionIndex: -1, Hostname: "trainer-12", PodOrdinal: 12}},
		{"malformed completion index", map[string]string{"JOB_COMPLETION_INDEX": "two"},
			Env{CompletionIndex: -1, PodOrdinal: -1, Invalid: []string{`JOB_COMPLETION_INDEX="two"`}}},
		{"negative completion index", map[string]string{"JOB_COMPLETION_INDEX": "-1"},
			Env{CompletionIndex: -1, PodOrdinal: -1, Invalid: []string{`JOB_COMPLETION_INDEX="-1"`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromEnv(func(k string) string { return tt.env[k] }); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("FromEnv() =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

func TestPodOrdinal(t *testing.T) {
	tests := []struct {
		host string
		n    int
		ok   bool
	}{
		{"trainer-0", 0, true},
		{"my-job-worker-17", 17, true},
		{"trainer", -1, false},
		{"trainer-", -1, false},
		{"-3", -1, false},
		{"trainer-3a", -1, false},
		{"trainer-+3", -1, false},
		{"", -1, false},
		{"trainer-99999999999999999999999", -1, false},
	}
	for _, tt := range tests {
		if n, ok := PodOrdinal(tt.host); n != tt.n || ok != tt.ok {
			t.Errorf("PodOrdinal(%q) = %d, %v; want %d, %v", tt.host, n, ok, tt.n, tt.ok)
		}
	}
}
