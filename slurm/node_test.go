package slurm

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestRunIDAndNodeList(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		runID string
		nodes string
	}{
		{"outside a job", nil, "", ""},
		{"first run", map[string]string{"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]"}, "77-r0", "n[1-3]"},
		{"requeued twice", map[string]string{"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}, "77-r2", ""},
		{"array task", map[string]string{"SLURM_JOB_ID": "81", "SLURM_ARRAY_JOB_ID": "80", "SLURM_ARRAY_TASK_ID": "1"}, "80_1-r0", ""},
		{"step nodes before the job's", map[string]string{"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_NODELIST": "n[2-3]"}, "9-r0", "n[2-3]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := FromEnv(func(k string) string { return tt.env[k] })
			if got := e.RunID(); got != tt.runID {
				t.Errorf("RunID() = %q, want %q", got, tt.runID)
			}
			if got := e.NodeList(); got != tt.nodes {
				t.Errorf("NodeList() = %q, want %q", got, tt.nodes)
			}
		})
	}
}

func TestRendezvousHosts(t *testing.T) {
	tests := []struct {
		nodes, want []string
	}{
		{nil, nil},
		{[]string{"a"}, []string{"a"}},
		{[]string{"a", "b"}, []string{"a"}},
		{[]string{"a", "b", "c"}, []string{"a", "b", "c"}},
		{[]string{"a", "b", "c", "d", "e"}, []string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		if got := RendezvousHosts(tt.nodes); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("RendezvousHosts(%v) = %v, want %v", tt.nodes, got, tt.want)
		}
	}
}

// TestNodeAddr runs NodeAddr against a stand-in scontrol printing what the
// real one prints for `scontrol show node -o NAME`.
func TestNodeAddr(t *testing.T) {
	dir := t.TempDir()
	script := `#!/bin/sh
case "$4" in
n2) echo "NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=127.0.0.3 NodeHostName=box Version=22.05.8 State=IDLE" ;;
noaddr) echo "NodeName=noaddr State=IDLE" ;;
*) echo "Node $4 not found" >&2; exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "scontrol"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH")) // exec looks programs up in this process's PATH
	s := Scheduler{}
	tests := []struct {
		name, want, err string
	}{
		{"n2", "127.0.0.3", ""},
		{"noaddr", "", "no NodeAddr"},
		{"n9", "", "Node n9 not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.NodeAddr(context.Background(), tt.name)
			if got != tt.want || (tt.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Errorf("NodeAddr(%s) = %q, %v; want %q, error containing %q", tt.name, got, err, tt.want, tt.err)
			}
		})
	}
}
