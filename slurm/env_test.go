package slurm

import (
	"reflect"
	"testing"
)

func TestFromEnv(t *testing.T) {
	unset := Env{ProcID: -1, NodeID: -1, NNodes: -1, ArrayTaskID: -1, RestartCount: -1, LocalID: -1}
	tests := []struct {
		name string
		env  map[string]string
		want Env
	}{
		{"outside slurm", nil, unset},
		{"full job step", map[string]string{
			"SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_NNODES": "4", "SLURM_JOB_NUM_NODES": "9",
			"SLURM_JOB_ID": "12345", "SLURM_ARRAY_JOB_ID": "12340", "SLURM_ARRAY_TASK_ID": "5",
			"SLURM_RESTART_COUNT": "2", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_LOCALID": "0",
			"SLURMD_NODENAME": "gpu02", "SLURM_STEP_NODELIST": "gpu[02-03]",
		}, Env{ProcID: 3, NodeID: 1, NNodes: 4, JobID: "12345", ArrayJobID: "12340", ArrayTaskID: 5,
			RestartCount: 2, JobNodeList: "gpu[01-04]", LocalID: 0, NodeName: "gpu02", StepNodeList: "gpu[02-03]"}},
		{"SLURM_JOB_NUM_NODES when SLURM_NNODES is absent", map[string]string{"SLURM_JOB_NUM_NODES": "8", "SLURM_JOB_ID": "7"},
			func() Env { e := unset; e.NNodes, e.JobID = 8, "7"; return e }()},
		{"blanks trimmed", map[string]string{"SLURM_PROCID": " 2 ", "SLURM_JOB_ID": " 7 "},
			func() Env { e := unset; e.ProcID, e.JobID = 2, "7"; return e }()},
		{"malformed integers are unset and reported", map[string]string{"SLURM_PROCID": "abc", "SLURM_LOCALID": "-1"},
			func() Env {
				e := unset
				e.Invalid = []string{`SLURM_PROCID="abc"`, `SLURM_LOCALID="-1"`}
				return e
			}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FromEnv(func(k string) string { return tt.env[k] })
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("FromEnv() =\n %+v\nwant\n %+v", got, tt.want)
			}
			if got.InJob() != (tt.want.JobID != "") {
				t.Errorf("InJob() = %v with SLURM_JOB_ID %q", got.InJob(), tt.want.JobID)
			}
		})
	}
}
