package agent

import (
	"testing"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
)

// TestSpareEnvHasNoAssignment: a parked spare's standbys get WorkerEnv's
// environment without any value of an assignment (unset, even when the
// launcher's own environment has one), and with what the node knows.
func TestSpareEnvHasNoAssignment(t *testing.T) {
	cfg := &configs.Config{NProcPerNode: 2, Role: "default"}
	base := []string{"PATH=/bin", "RANK=7", "MASTER_PORT=1"}
	env := envMap(SpareEnv(base, cfg, 1, nil))
	for _, k := range assignmentVars {
		if v, ok := env[k]; ok {
			t.Errorf("%s=%q in a parked spare's environment", k, v)
		}
	}
	for k, want := range map[string]string{"PATH": "/bin", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "ROLE_NAME": "default", "OMP_NUM_THREADS": "1"} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	// Every variable WorkerEnv sets for an assignment is either kept or
	// named in assignmentVars: a new one cannot slip through stale.
	asg := rendezvous.Assignment{RunID: "job", Round: 3, GroupRank: 1, GroupWorldSize: 2, RankBase: 2, WorldSize: 4,
		MasterAddr: "127.0.0.2", MasterPort: 41234, MaxRestarts: 3, RestartsUsed: 1}
	full := envMap(WorkerEnv(base, cfg, asg, 1, "/tmp/err.json", nil))
	blank := envMap(WorkerEnv(base, cfg, rendezvous.Assignment{}, 1, "", nil))
	for k, v := range full {
		if blank[k] != v {
			if _, kept := env[k]; kept {
				t.Errorf("%s depends on the assignment (%q vs %q) but a parked spare keeps it", k, v, blank[k])
			}
		}
	}
}
