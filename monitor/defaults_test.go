package monitor

import (
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestDefaultClocks: with no rank timeout configured, a rank that
// heartbeats is held to the default clocks (here shortened: start-up 4 s,
// learned floor 1 s after 5 intervals): a silent start-up and a silence
// after the learning are hangs, marked as the default's; slow first steps,
// an announced phase, and a silence while the rank computes or writes are
// not; a "step" section gives no allowance; default_timeouts false and a
// rank that never connects keep the old behaviour (no clock).
func TestDefaultClocks(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	const floor, startup = time.Second, 4 * time.Second
	tests := []struct {
		name   string
		script string
		off    bool          // default_timeouts false
		kind   HangKind      // "": no hang within quiet
		minTO  time.Duration // least timeout of the hang
		quiet  time.Duration
	}{
		{name: "silent after learning", script: "connect;hbn 8 20ms;sleep 60s", kind: KindHeartbeat, minTO: floor},
		{name: "silent start-up", script: "connect;sleep 60s", kind: KindInitialHeartbeat, minTO: startup},
		{name: "step section gives no allowance", script: "connect;hbn 8 20ms;open step;sleep 60s", kind: KindHeartbeat, minTO: floor},
		// 5 x the 1.2 s first interval is learned: the hang waits for it.
		{name: "slow first steps", script: "connect;sleep 3s;hb;sleep 1200ms;hbn 8 20ms;sleep 60s", kind: KindHeartbeat, minTO: 6 * time.Second},
		{name: "announced phase", script: "connect;hbn 8 20ms;open checkpointing;sleep 3s;close checkpointing;hbn 3 20ms;exit 0", quiet: 6 * time.Second},
		{name: "computing", script: "connect;hbn 8 20ms;busy 5s;hbn 3 20ms;exit 0", quiet: 7 * time.Second},
		{name: "writing", script: "connect;hbn 8 20ms;writes 5s;hbn 3 20ms;exit 0", quiet: 7 * time.Second},
		{name: "default_timeouts false", script: "connect;hbn 8 20ms;sleep 60s", off: true, quiet: 5 * time.Second},
		{name: "never connects", script: "sleep 60s", quiet: 7 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ft := configs.DefaultFaultTolerance()
			ft.CalculateTimeouts = false
			ft.DefaultTimeouts = !tc.off
			m := startManager(t, Options{NLocal: 1, FT: ft, MinComputedTimeout: -1,
				Defaults: DefaultClocks{Startup: startup, LearnedFloor: floor, LearnIntervals: 5}})
			p := startRank(t, m, tc.script)
			m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
			if tc.kind == "" {
				noHang(t, m, tc.quiet)
				return
			}
			h := waitHang(t, m, 60*time.Second)
			if h.Kind != tc.kind || !h.DefaultTimeout || h.Timeout < tc.minTO {
				t.Errorf("hang %+v, want kind %s by a default clock of at least %v", h, tc.kind, tc.minTO)
			}
			// Never early; the activity check adds its window.
			if h.Elapsed < h.Timeout+activityWindow {
				t.Errorf("declared after %v of silence, before timeout %v + the activity window", h.Elapsed, h.Timeout)
			}
			if sig := signalOf(p.exited(t, 30*time.Second)); sig == 0 {
				t.Error("the hung rank was not killed")
			}
		})
	}
}
