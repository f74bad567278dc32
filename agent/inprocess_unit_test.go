package agent

// Tests of the in-process restart as a unit (inProcess), without the
// agent's loop: its phases, each transition, the facts it gathers and the
// mixedGroup. The agent-level tests (inprocess_test.go,
// inprocess_survivors_test.go) run it inside Run.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// unitHost is the agent as an inProcess sees it (inProcessHost): it
// records exits as recordExit does and counts the rest. The unit calls it
// from the test's goroutine only.
type unitHost struct {
	exits    []int // local ranks, in order
	failures []int
	reports  int // reportFailures calls
	swaps    int
}

func (h *unitHost) recordExit(e spawn.Exit, end *cycleEnd) {
	if _, seen := end.exitCodes[e.LocalRank]; seen {
		return
	}
	end.exitCodes[e.LocalRank] = e.TorchExitCode()
	h.exits = append(h.exits, e.LocalRank)
}
func (h *unitHost) recordRankFailure(e spawn.Exit, _ bool) {
	h.failures = append(h.failures, e.LocalRank)
}
func (h *unitHost) reportFailures([]ranklogs.Failure, *ranklogs.Attempt, time.Duration) {
	h.reports++
}
func (h *unitHost) swapDone() { h.swaps++ }

// ipUnit is an inProcess wired to fakes.
type ipUnit struct {
	*inProcess
	host       *unitHost
	mons       *ipMonitors
	ranks      *fakeRanks
	eventsPath string
	logs       *ranklogs.Logs
}

func newIPUnit(t *testing.T, nproc int, capable ...int) *ipUnit {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.jsonl")
	ev, err := eventlog.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Close() })
	logs, err := ranklogs.New(ranklogs.Options{LogDir: t.TempDir(), RunID: "job", Console: io.Discard, ConsoleErr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	u := &ipUnit{host: &unitHost{}, mons: newIPMonitors(capable...), ranks: newFakeRanks(), eventsPath: path, logs: logs}
	u.inProcess = &inProcess{d: inProcessDeps{on: true, nproc: nproc, rejoinTimeout: 10 * time.Second,
		stopTimeout: time.Second, ipm: u.mons, mons: u.mons, ranks: u.ranks, agentStore: true,
		log: slog.New(slog.DiscardHandler), ev: ev, met: metrics.New(), host: u.host}}
	return u
}

func (u *ipUnit) events(t *testing.T, kind string) []map[string]any {
	t.Helper()
	all, err := eventlog.Read(u.eventsPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range all {
		if e["event"] == kind {
			out = append(out, e)
		}
	}
	return out
}

// group starts a fake group running local ranks 0..n-1.
func (u *ipUnit) group(t *testing.T, n int) *fakeGroup {
	t.Helper()
	_, err := u.ranks.StartGroup(specsFor(n))
	if err != nil {
		t.Fatal(err)
	}
	return u.ranks.wait(t)
}

// attempt is round's log attempt for nproc ranks.
func (u *ipUnit) attempt(t *testing.T, round int) *ranklogs.Attempt {
	t.Helper()
	infos := make([]ranklogs.RankInfo, u.d.nproc)
	for i := range infos {
		infos[i] = ranklogs.RankInfo{LocalRank: i, GlobalRank: i}
	}
	att, err := u.logs.Attempt(round, infos)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { att.Close() })
	return att
}

func specsFor(n int) []spawn.Spec {
	specs := make([]spawn.Spec, n)
	for i := range specs {
		specs[i] = spawn.Spec{LocalRank: i}
	}
	return specs
}

// failedCycle is round's cycle on g whose local ranks failed have exited
// with code 1 (their exits taken, as supervise takes them).
func (u *ipUnit) failedCycle(t *testing.T, round int, g *fakeGroup, failed ...int) ipCycle {
	t.Helper()
	end := &cycleEnd{kind: endRankFailure, exitCodes: map[int]int{}}
	for _, lr := range failed {
		g.exit(lr, 1, 0)
		e := <-g.exits
		u.host.recordExit(e, end)
		end.failures = append(end.failures, ranklogs.Failure{LocalRank: lr, GlobalRank: lr, ExitCode: 1, Time: e.At})
	}
	end.reason = "local rank failed"
	return ipCycle{asg: rendezvous.Assignment{Round: round, WorldSize: u.d.nproc, MaxRestarts: 3}, end: end,
		group: g, att: u.attempt(t, round), timing: &cycleTiming{}}
}

// TestInProcessPhase: the unit's phase is read from its state, in one
// place, and decides its restart mode and whether the rejoin bound runs.
func TestInProcessPhase(t *testing.T) {
	hour := func() *time.Timer { return time.NewTimer(time.Hour) }
	tests := []struct {
		name      string
		p         *inProcess
		want      ipPhase
		inProcess bool // mode
		bound     bool // rejoinTimer
	}{
		{"nothing kept", &inProcess{}, ipIdle, false, false},
		{"survivors kept", &inProcess{kept: &keptRanks{}}, ipKept, true, false},
		{"survivors notified", &inProcess{watch: &rejoinWatch{waiting: map[int]bool{0: true}, stepping: map[int]bool{0: true},
			timer: hour()}}, ipRejoining, false, true},
		{"every survivor rejoined", &inProcess{watch: &rejoinWatch{waiting: map[int]bool{}, stepping: map[int]bool{0: true},
			timer: hour()}}, ipStepping, false, false},
		{"the bound passed", &inProcess{watch: &rejoinWatch{waiting: map[int]bool{0: true}, stepping: map[int]bool{0: true},
			timer: hour(), overdue: true}}, ipOverdue, false, false},
		{"every survivor stepped", &inProcess{watch: &rejoinWatch{completed: true}}, ipComplete, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if w := tc.p.watch; w != nil && w.timer != nil {
				defer w.timer.Stop()
			}
			if got := tc.p.phase(); got != tc.want {
				t.Errorf("phase %s, want %s", got, tc.want)
			}
			wantMode := map[bool]policy.Mode{true: policy.ModeInProcess, false: policy.ModeFull}[tc.inProcess]
			if got := tc.p.mode(); got != wantMode {
				t.Errorf("mode %s, want %s", got, wantMode)
			}
			if got := tc.p.rejoinTimer() != nil; got != tc.bound {
				t.Errorf("rejoin bound running %v, want %v", got, tc.bound)
			}
		})
	}
}

// TestInProcessKeep: keeping's decision and what keeping the survivors
// does (kept, the monitors' end of the cycle, one failure report, the
// inprocess_kept record), or not (every rank stops: idle).
func TestInProcessKeep(t *testing.T) {
	tests := []struct {
		name      string
		nproc     int
		capable   []int
		off       bool          // --restart-mode full
		alsoDies  time.Duration // > 0: local rank 2 dies this long after the failure
		kept      bool          // a restart was followed in the failed round, before its first steps
		round     int           // the failed round (> 0: a restart's round, its fresh ranks unstepped)
		want      []int         // survivors kept (nil: none)
		wantFail  []int         // failed, in the kept record
		wantFallb string        // the cycle's fallback
	}{
		{"every survivor registered", 2, []int{0, 1}, false, 0, false, 0, []int{0}, []int{1}, ""},
		{"a survivor did not register", 2, []int{1}, false, 0, false, 0, nil, nil, ""},
		{"--restart-mode full", 2, []int{0, 1}, true, 0, false, 0, nil, nil, ""},
		{"a rank dies within the settle window", 3, []int{0, 1, 2}, false, 20 * time.Millisecond, false, 0, []int{0}, []int{1, 2}, ""},
		{"a failure during the in-process restart", 2, []int{0, 1}, false, 0, true, 1, nil, nil, "failure_during"},
		{"a failure before a fresh round's first steps", 2, []int{0, 1}, false, 0, false, 1, nil, nil, "failure_during"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newIPUnit(t, tc.nproc, tc.capable...)
			u.d.on = !tc.off
			g := u.group(t, tc.nproc)
			c := u.failedCycle(t, tc.round, g, 1)
			if tc.alsoDies > 0 {
				time.AfterFunc(tc.alsoDies, func() { g.exit(2, 0, syscall.SIGKILL) })
			}
			if tc.kept {
				u.watch = &rejoinWatch{round: tc.round, waiting: map[int]bool{}, stepping: map[int]bool{0: true}}
			}
			in := policy.SurvivorsInput{InProcess: u.monitors() != nil, Failure: policy.RankCrash, MaxRestarts: 3}
			stay := u.keep(in, c)
			if stay != (tc.want != nil) {
				t.Fatalf("keep = %v, want %v", stay, tc.want != nil)
			}
			kept := u.events(t, EventInProcessKept)
			if !stay {
				if u.phase() != ipIdle || len(kept) != 0 || u.host.reports != 0 {
					t.Fatalf("phase %s, kept records %v, %d failure reports; want idle, none, none", u.phase(), kept, u.host.reports)
				}
				if u.fallback != tc.wantFallb {
					t.Fatalf("fallback %q, want %q", u.fallback, tc.wantFallb)
				}
				return
			}
			if u.phase() != ipKept || !slices.Equal(u.kept.survivors, tc.want) || u.kept.group != g {
				t.Fatalf("phase %s, kept %+v; want kept %v of the cycle's group", u.phase(), u.kept, tc.want)
			}
			if len(kept) != 1 || fmt.Sprint(kept[0]["survivors"]) != fmt.Sprint(tc.want) || fmt.Sprint(kept[0]["failed"]) != fmt.Sprint(tc.wantFail) {
				t.Fatalf("inprocess_kept %v, want survivors %v, failed %v", kept, tc.want, tc.wantFail)
			}
			u.mons.fakeMonitors.mu.Lock()
			ended := slices.Clone(u.mons.ended)
			u.mons.fakeMonitors.mu.Unlock()
			if u.host.reports != 1 || !slices.Equal(ended, []bool{false}) || len(u.keptAtts) != 1 {
				t.Fatalf("%d failure reports, monitors' cycle ends %v, %d kept log attempts; want 1, [false], 1",
					u.host.reports, ended, len(u.keptAtts))
			}
			if c.timing.stopStart.IsZero() || c.timing.stopped.Before(c.timing.stopStart) {
				t.Fatalf("timing %+v", c.timing)
			}
			u.stopKept("the test ends")
			if u.phase() != ipIdle || stoppedCount(g) != 1 || u.keptAtts != nil {
				t.Fatalf("after stopKept: phase %s, group stopped %d times", u.phase(), stoppedCount(g))
			}
		})
	}
}

// TestInProcessStart: the round for kept survivor 0 (local rank 1
// failed) starts the missing ranks and notifies the survivors that can
// take their notice; the others start afresh; a failed start keeps them.
func TestInProcessStart(t *testing.T) {
	tests := []struct {
		name      string
		capable   []int
		ended     bool  // the survivor ended while the round formed
		startErr  error // the fresh ranks cannot start
		wantFresh []int
		want      ipPhase
		wantMode  policy.Mode
	}{
		{"the survivor is notified", []int{0}, false, nil, []int{1}, ipRejoining, policy.ModeInProcess},
		{"the survivor ended while the round formed", []int{0}, true, nil, []int{0, 1}, ipIdle, policy.ModeFull},
		{"the survivor has no session", nil, false, nil, []int{0, 1}, ipIdle, policy.ModeFull},
		{"the fresh ranks cannot start", []int{0}, false, fmt.Errorf("no fork"), nil, ipKept, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newIPUnit(t, 2, tc.capable...)
			g0 := u.group(t, 2)
			g0.exit(1, 1, 0)
			<-g0.exits // the failed rank's exit was the cycle's
			u.kept = &keptRanks{group: g0, survivors: []int{0}, failedAt: time.Now(), why: "test"}
			if tc.ended {
				g0.exit(0, 1, 0)
			}
			u.ranks.startErr = tc.startErr
			asg := rendezvous.Assignment{Round: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}
			timing := &cycleTiming{}
			g, err := u.start(ipCycle{asg: asg, timing: timing}, specsFor(2), u.attempt(t, 1))
			if (err != nil) != (tc.startErr != nil) {
				t.Fatalf("start: %v", err)
			}
			if got := u.phase(); got != tc.want {
				t.Fatalf("phase %s, want %s", got, tc.want)
			}
			if err != nil {
				if !slices.Equal(u.kept.survivors, []int{0}) || u.host.swaps != 0 {
					t.Fatalf("kept %+v, swaps %d after a failed start", u.kept, u.host.swaps)
				}
				return
			}
			fresh := u.ranks.wait(t)
			var started []int
			for _, sp := range fresh.specs {
				started = append(started, sp.LocalRank)
			}
			if !slices.Equal(started, tc.wantFresh) || u.cycleMode != tc.wantMode || u.host.swaps != 1 {
				t.Fatalf("started %v, mode %q, swaps %d; want %v, %q, 1", started, u.cycleMode, u.host.swaps, tc.wantFresh, tc.wantMode)
			}
			if timing.spawnStart.IsZero() || timing.spawned.Before(timing.spawnStart) {
				t.Fatalf("timing %+v", timing)
			}
			if got := len(g.PIDs()); got != 2 {
				t.Fatalf("the round's group runs %d ranks, want 2", got)
			}
			replaced := len(u.events(t, EventInProcessReplaced))
			if tc.want == ipRejoining {
				if n := u.mons.notice(t); n.LocalRank != 0 || n.Round != 1 || n.StorePrefix != StorePrefix(1) {
					t.Fatalf("notice %+v", n)
				}
				if replaced != 0 {
					t.Fatalf("%d survivors replaced", replaced)
				}
				u.endWatch()
				return
			}
			u.mons.noMoreNotices(t)
			if replaced != 1 {
				t.Fatalf("%d inprocess_replaced records, want the survivor's", replaced)
			}
		})
	}
}

// TestInProcessReports: the survivors' reports move the followed restart
// from rejoining to stepping to complete; reports of another round or of
// a rank not followed change nothing; a fresh rank's first step counts
// toward freshRoundUnstepped.
func TestInProcessReports(t *testing.T) {
	rep := func(lr, round int, phase string) monitor.InProcessReport {
		return monitor.InProcessReport{LocalRank: lr, InProcessReport: ftwire.InProcessReport{Round: round, Phase: phase,
			RestoreS: 0.03}}
	}
	type step struct {
		rep  monitor.InProcessReport
		want ipPhase
	}
	tests := []struct {
		name                string
		steps               []step
		rejoined, firstStep int // records
		fresh               int // fresh ranks' first steps counted
	}{
		{"rejoin, then step", []step{{rep(0, 1, "rejoined"), ipRejoining}, {rep(1, 1, "rejoined"), ipStepping},
			{rep(0, 1, "first_step"), ipStepping}, {rep(1, 1, "first_step"), ipComplete}}, 2, 2, 2},
		{"a first step is a rejoin", []step{{rep(0, 1, "first_step"), ipRejoining}, {rep(1, 1, "first_step"), ipComplete}}, 0, 2, 2},
		{"another round, a rank not followed, a repeat", []step{{rep(0, 2, "rejoined"), ipRejoining},
			{rep(5, 1, "rejoined"), ipRejoining}, {rep(0, 1, "rejoined"), ipRejoining}, {rep(0, 1, "rejoined"), ipRejoining}}, 1, 0, 0},
		{"a fresh rank's first step", []step{{rep(2, 1, "first_step"), ipRejoining}}, 0, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newIPUnit(t, 3, 0, 1)
			u.newRound()
			failedAt := time.Now().Add(-time.Second)
			u.watch = &rejoinWatch{round: 1, failedAt: failedAt, notices: map[int]time.Time{0: failedAt, 1: failedAt},
				waiting: map[int]bool{0: true, 1: true}, stepping: map[int]bool{0: true, 1: true},
				phases: map[string]time.Duration{}, timer: time.NewTimer(time.Hour)}
			defer u.watch.timer.Stop()
			for i, s := range tc.steps {
				u.report(context.Background(), 1, s.rep)
				if got := u.phase(); got != s.want {
					t.Fatalf("after report %d (%+v): phase %s, want %s", i, s.rep, got, s.want)
				}
			}
			if r, f := len(u.events(t, EventInProcessRejoined)), len(u.events(t, EventInProcessFirstStep)); r != tc.rejoined || f != tc.firstStep {
				t.Fatalf("%d rejoined and %d first-step records, want %d and %d", r, f, tc.rejoined, tc.firstStep)
			}
			if len(u.freshSteps) != tc.fresh {
				t.Fatalf("fresh steps %v, want %d", u.freshSteps, tc.fresh)
			}
			if u.phase() == ipComplete && (len(u.phases) != 6 || u.phases["restore"] != 30*time.Millisecond) {
				t.Fatalf("the restart's phases %v", u.phases)
			}
		})
	}
}

// TestInProcessOverdue: at the bound, a survivor that opened its session
// but did not rejoin is killed and the restart falls back; one without a
// session in a round of survivors and fresh ranks is replaced within it.
func TestInProcessOverdue(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capable  []int
		want     ipPhase
		fallback string
	}{
		{"opened its session, did not rejoin", []int{0}, ipOverdue, "rejoin_timeout"},
		{"stuck without a session", nil, ipStepping, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newIPUnit(t, 2, tc.capable...)
			g0 := u.group(t, 2)
			mg := newMixedGroup()
			mg.add(g0, []int{0, 1})
			u.watch = &rejoinWatch{round: 1, notices: map[int]time.Time{0: time.Now()}, waiting: map[int]bool{0: true},
				stepping: map[int]bool{0: true}, phases: map[string]time.Duration{}, timer: time.NewTimer(time.Hour),
				specs: map[int]spawn.Spec{0: {LocalRank: 0}}}
			defer u.watch.timer.Stop()
			u.overdue(mg)
			if got := u.phase(); got != tc.want || u.fallback != tc.fallback {
				t.Fatalf("phase %s, fallback %q; want %s, %q", got, u.fallback, tc.want, tc.fallback)
			}
			g0.mu.Lock()
			sig := slices.Clone(g0.signalled)
			g0.mu.Unlock()
			if !slices.Equal(sig, []syscall.Signal{syscall.SIGKILL}) {
				t.Fatalf("survivor signals %v, want one SIGKILL", sig)
			}
			if tc.want == ipStepping {
				if r := u.ranks.wait(t); len(r.specs) != 1 || mg.ownerOf(0) != RankGroup(r) || !u.watch.replaced {
					t.Fatalf("replacement %v not the owner of local rank 0", r.specs)
				}
			}
		})
	}
}

// TestInProcessRecordCycle: the verdict's cycle says the cycle's mode,
// phases and fallback, and the next cycle starts from full.
func TestInProcessRecordCycle(t *testing.T) {
	p := &inProcess{cycleMode: policy.ModeInProcess, phases: map[string]time.Duration{"total": 1500 * time.Microsecond},
		fallback: "rejoin_timeout"}
	var c verdict.Cycle
	p.recordCycle(&c)
	if c.Mode != string(policy.ModeInProcess) || c.InProcessMS["total"] != 1.5 || c.InProcessFallback != "rejoin_timeout" {
		t.Fatalf("cycle %+v", c)
	}
	var next verdict.Cycle
	p.recordCycle(&next)
	if next.Mode != string(policy.ModeFull) || next.InProcessMS != nil || next.InProcessFallback != "" {
		t.Fatalf("next cycle %+v", next)
	}
}

// TestSilentSurvivor: after a hang a survivor may be kept only when its
// last heartbeat came clearly (its longest interval, at least a tenth of
// its timeout) after the hung rank's last one.
func TestSilentSurvivor(t *testing.T) {
	hungAt := time.Now().Add(-3 * time.Second)
	hungStopped := func(time.Duration) time.Time { return hungAt }
	const s3, ms300 = 3 * time.Second, 300 * time.Millisecond
	tests := []struct {
		name    string
		silence map[int]monitor.Silence
		want    string // in the answer ("": none silent)
	}{
		{"heartbeated after the hung rank stopped", map[int]monitor.Silence{0: {Last: hungAt.Add(time.Second), Timeout: s3, MaxInterval: ms300}}, ""},
		{"no monitor session", nil, "local rank 0 has no monitor session"},
		{"heartbeat timeouts off, heartbeated after", map[int]monitor.Silence{0: {Last: hungAt.Add(time.Second), MaxInterval: ms300}}, ""},
		{"heartbeat timeouts off, stopped with it", map[int]monitor.Silence{0: {Last: hungAt.Add(5 * time.Millisecond), MaxInterval: ms300}}, "local rank 0's last heartbeat"},
		{"stopped with it (a collective)", map[int]monitor.Silence{0: {Last: hungAt.Add(5 * time.Millisecond), Timeout: s3, MaxInterval: ms300}}, "local rank 0's last heartbeat"},
		{"stopped before it (the hung one)", map[int]monitor.Silence{0: {Last: hungAt.Add(-time.Second), Timeout: s3, MaxInterval: ms300}}, "local rank 0's last heartbeat"},
		{"within its longest interval", map[int]monitor.Silence{0: {Last: hungAt.Add(time.Second), Timeout: s3, MaxInterval: 1500 * time.Millisecond}}, "local rank 0's last heartbeat"},
		{"within a tenth of its timeout", map[int]monitor.Silence{0: {Last: hungAt.Add(time.Second), Timeout: 20 * time.Second, MaxInterval: ms300}}, "local rank 0's last heartbeat"},
		{"found hung too", map[int]monitor.Silence{0: {Hung: true}}, "local rank 0 was found hung too"},
		{"the second survivor is silent", map[int]monitor.Silence{0: {Last: hungAt.Add(time.Second), Timeout: s3, MaxInterval: ms300},
			1: {Last: hungAt, Timeout: s3, MaxInterval: ms300}}, "local rank 1's last heartbeat"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newIPMonitors()
			m.silence = tc.silence
			got := silentSurvivor(m, []int{0, 1}[:max(1, len(tc.silence))], hungStopped)
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("silentSurvivor = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHungStopped: when the hung rank last progressed: its last heartbeat
// when this node's monitor killed it (or its expiry less its timeout
// without one); for another node's hang, the survivor's own timeout
// before the round's end was seen.
func TestHungStopped(t *testing.T) {
	last := time.Now().Add(-5 * time.Second)
	expired := time.Now().Add(-time.Second)
	tests := []struct {
		name string
		hang *monitor.Hang // fired by this node's monitor for local rank 1
		want func(seen time.Time) time.Time
	}{
		{"this node's hang", &monitor.Hang{LocalRank: 1, LastHeartbeat: last}, func(time.Time) time.Time { return last }},
		{"this node's hang, no heartbeat", &monitor.Hang{LocalRank: 1, ExpiredAt: expired, Timeout: 2 * time.Second},
			func(time.Time) time.Time { return expired.Add(-2 * time.Second) }},
		{"another node's hang", nil, func(seen time.Time) time.Time { return seen.Add(-3 * time.Second) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newIPUnit(t, 2, 0, 1)
			end := cycleEnd{kind: endRoundEnded, exitCodes: map[int]int{}}
			if tc.hang != nil {
				u.mons.fakeMonitors.mu.Lock()
				u.mons.hang, u.mons.fired[1] = tc.hang, true
				u.mons.fakeMonitors.mu.Unlock()
				end = cycleEnd{kind: endRankFailure, hang: true, exitCodes: map[int]int{1: 137}}
			}
			before := time.Now()
			got := u.hungStopped(end, 0)(3 * time.Second)
			after := time.Now()
			if lo, hi := tc.want(before), tc.want(after); got.Before(lo) || got.After(hi) {
				t.Fatalf("hung rank stopped at %v, want in [%v, %v]", got, lo, hi)
			}
		})
	}
}

// TestMixedGroup: each local rank belongs to the part that runs it now;
// the exits of ranks a part no longer runs are not delivered.
func TestMixedGroup(t *testing.T) {
	r := newFakeRanks()
	start := func(lrs ...int) *fakeGroup {
		specs := make([]spawn.Spec, len(lrs))
		for i, lr := range lrs {
			specs[i] = spawn.Spec{LocalRank: lr}
		}
		if _, err := r.StartGroup(specs); err != nil {
			t.Fatal(err)
		}
		return r.wait(t)
	}
	old := start(0, 1)
	m := newMixedGroup()
	m.add(old, []int{0})
	exits := m.Exits()
	fresh := start(1)
	m.add(fresh, []int{1})
	if m.ownerOf(0) != RankGroup(old) || m.ownerOf(1) != RankGroup(fresh) || m.ownerOf(2) != nil {
		t.Fatal("owners")
	}
	if pids := m.PIDs(); len(pids) != 2 {
		t.Fatalf("pids %v", pids)
	}
	old.exit(1, 1, 0) // the old process of local rank 1: not the round's
	fresh.exit(1, 0, 0)
	select {
	case e := <-exits:
		if e.LocalRank != 1 || e.Code != 0 {
			t.Fatalf("exit %+v, want the fresh rank 1's", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit delivered")
	}
	if err := m.Signal(2, syscall.SIGKILL); err == nil {
		t.Fatal("signalled a rank the group does not run")
	}
	res := m.Stop(syscall.SIGTERM, time.Second)
	if len(res.Exits) != 1 || res.Exits[0].LocalRank != 0 {
		t.Fatalf("stop reported %+v, want local rank 0's exit only", res.Exits)
	}
	select {
	case e := <-exits:
		t.Fatalf("exit %+v delivered after the stale one", e)
	case <-time.After(50 * time.Millisecond):
	}
}
