package integration

import (
	"path/filepath"
	"testing"
	"time"
)

// TestHostileRankCannotDisableHangDetection: local rank 1 sends timeouts
// updates carrying 0, a negative value, null, NaN, inf or 1e300 (natively and
// as nvrx pickles) in every cycle while local rank 0 hangs. With a 3 s
// heartbeat timeout both hangs (cycle 0 and, after the restart, cycle 1)
// are still caught, long before the hung rank's own 3,600 s sleep.
func TestHostileRankCannotDisableHangDetection(t *testing.T) {
	worker, err := filepath.Abs("testdata/hostile_worker.py")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ proto, value string }{
		{"native", "zero"}, {"native", "negative"}, {"native", "null"}, {"native", "1e300"},
		{"nvrx", "zero"}, {"nvrx", "negative"}, {"nvrx", "null"}, {"nvrx", "nan"}, {"nvrx", "inf"}, {"nvrx", "1e300"},
	}
	for _, tc := range cases {
		t.Run(tc.proto+"-"+tc.value, func(t *testing.T) {
			t.Parallel()
			j := newJob(t)
			start := time.Now()
			code := j.run(3*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
				"--max-restarts", "1", "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "3",
				worker, tc.proto, tc.value, filepath.Join(j.dir, "sent"))
			if code == 0 {
				t.Fatalf("exit 0, want a failure after two hangs\n%s", j.stderr.String())
			}
			hangs := j.eventsOf("rank_hang")
			if len(hangs) != 2 {
				t.Fatalf("rank_hang events %v, want one per cycle\n%s", hangs, j.stderr.String())
			}
			for _, h := range hangs {
				if h["timeout_kind"] != "heartbeat" || h["rank"] != float64(0) {
					t.Fatalf("rank_hang %v, want rank 0's heartbeat timeout", h)
				}
			}
			if took := time.Since(start); took > 100*time.Second {
				t.Fatalf("the job took %v: a hang went undetected for a long time", took)
			}
		})
	}
}
