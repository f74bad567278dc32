package monitor

import (
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestRankRecordsFitEventlog: the records a Manager hands Options.OnEvent
// fit the typed records of eventlog (the ones ft-resumer report decodes):
// a key renamed here, or one the record always has left out, fails this
// test instead of emptying a lane of the report.
func TestRankRecordsFitEventlog(t *testing.T) {
	testenv.SkipShort(t, "runs a real rank-client process")
	t.Parallel()
	var rec recorder
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	m := startManager(t, Options{NLocal: 1, FT: ft, MinComputedTimeout: -1, OnEvent: rec.add})
	p := startRank(t, m, "connect;hb;open step 4;close step;open checkpointing;close checkpointing;open step 5;close step;hb;mark done;sleep 30s;exit 0")
	m.BeginCycle(1, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "done", 30*time.Second)
	eventually(t, 10*time.Second, "first heartbeat, first step and checkpoint recorded", func() bool {
		m.RankStatus(0) // drains the session
		return len(rec.of(EventFirstHeartbeat)) == 1 && len(rec.of(EventFirstStep)) == 1 && len(rec.of(EventCheckpoint)) == 1
	})
	m.EndCycle()
	for _, kind := range []string{EventFirstHeartbeat, EventFirstStep, EventCheckpoint, EventCycleSteps} {
		got := rec.of(kind)
		if len(got) != 1 {
			t.Fatalf("%d %s records, want 1", len(got), kind)
		}
		fields := map[string]any{}
		for k, v := range got[0] {
			if k != "event" { // the recorder's, not the monitor's
				fields[k] = v
			}
		}
		if err := eventlog.CheckFields(kind, fields); err != nil {
			t.Error(err)
		}
	}
}

// TestEventKindsAreEventlogs: the monitor's kinds are the ones eventlog
// decodes.
func TestEventKindsAreEventlogs(t *testing.T) {
	for got, want := range map[string]string{EventFirstHeartbeat: eventlog.RankFirstHeartbeat, EventFirstStep: eventlog.RankFirstStep,
		EventCheckpoint: eventlog.RankCheckpoint, EventCycleSteps: eventlog.RankSteps, EventLauncherStall: eventlog.LauncherStall} {
		if got != want {
			t.Errorf("monitor kind %q, eventlog's %q", got, want)
		}
	}
}
