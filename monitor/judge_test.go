package monitor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/stacks"
)

// lineOf is the line of testdata/hang_kinds.py holding marker.
func lineOf(t *testing.T, marker string) int {
	t.Helper()
	b, err := os.ReadFile("testdata/hang_kinds.py")
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, marker) {
			return i + 1
		}
	}
	t.Fatalf("no %s in hang_kinds.py", marker)
	return 0
}

// TestHangJudgedFromStacks: three torch ranks on one node; rank 1 hangs
// in one of four ways while ranks 0 and 2 wait for it in an all_reduce.
// Whatever clock expires first, the stacks of all three are taken before
// any is killed, rank 1 is named and killed alone, and ranks 0 and 2
// (whose clocks expire too) are left to the crash path: they end by
// themselves when the collective fails.
func TestHangJudgedFromStacks(t *testing.T) {
	testenv.SkipShort(t, "runs real torch ranks")
	wait := fmt.Sprintf("hang_kinds.py:%d in step", lineOf(t, "# WAIT"))
	for _, tc := range []struct {
		kind string
		text string
	}{
		{"lock", fmt.Sprintf("rank 1 hung: in hang_kinds.py:%d in hang, not in a collective", lineOf(t, "HANG:lock"))},
		{"fifo", fmt.Sprintf("rank 1 hung: in hang_kinds.py:%d in hang, not in a collective", lineOf(t, "HANG:fifo"))},
		{"stop", "rank 1 hung: stopped by a signal (SIGSTOP)"},
		{"collective", fmt.Sprintf("rank 1 hung: in all_reduce at hang_kinds.py:%d in hang", lineOf(t, "HANG:collective"))},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c, err := stacks.New()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ft := configs.DefaultFaultTolerance()
			ft.CalculateTimeouts = false
			ft.InitialRankHeartbeatTimeout = fptr(120)
			ft.RankHeartbeatTimeout = fptr(2)
			m := startManager(t, Options{NLocal: 3, FT: ft, MinComputedTimeout: -1, Stacks: c})
			fifo := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			procs := startGlooRanks(t, m, c, "testdata/hang_kinds.py", tc.kind, fifo)
			pids := map[int]int{}
			for lr, p := range procs {
				pids[lr] = p.cmd.Process.Pid
			}
			h := waitHang(t, m, 90*time.Second)
			if h.LocalRank != 1 || h.Judgement == nil {
				t.Fatalf("hang %+v: want local rank 1, judged from the stacks", h)
			}
			f := h.Judgement.Finding
			t.Logf("finding (%s): %s", h.Judgement.Took, f.Text)
			if !f.Known || len(f.Culprits) != 1 || f.Culprits[0] != 1 || !strings.Contains(f.Text, tc.text) ||
				!strings.Contains(f.Text, "ranks 0, 2: in all_reduce at "+wait) {
				t.Errorf("finding %+v\nwant %q and ranks 0, 2 waiting at %s", f, tc.text, wait)
			}
			if len(h.Judgement.Ranks) != 3 {
				t.Errorf("stacks of %d ranks, want 3", len(h.Judgement.Ranks))
			}
			st := procs[1].exited(t, 30*time.Second)
			if tc.kind == "stop" {
				syscall.Kill(pids[1], syscall.SIGCONT)
			}
			if s := signalOf(st); s != syscall.SIGKILL {
				t.Errorf("rank 1 ended by %v (%v), want SIGKILL", s, st)
			}
			// The others end by themselves (the collective fails); the
			// monitor kills none of them.
			for _, lr := range []int{0, 2} {
				if st := procs[lr].exited(t, 60*time.Second); signalOf(st) != 0 {
					t.Errorf("rank %d ended by %v: want its own exit", lr, signalOf(st))
				}
			}
			noHang(t, m, 100*time.Millisecond)
		})
	}
}

// TestDefaultClockJudged: with no timeout configured and the stacks on,
// the learned step clock is short (at least 1 s) because every expiry is
// judged: rank 1 deadlocked is killed about a second after its last
// heartbeat; rank 1 silent for 3 s while computing, waiting on its
// DataLoader's worker or saving is not (a hang_dismissed record), and the
// job runs to its end.
func TestDefaultClockJudged(t *testing.T) {
	testenv.SkipShort(t, "runs real torch ranks")
	for _, kind := range []string{"lock", "busy", "data", "save"} {
		t.Run(kind, func(t *testing.T) {
			c, err := stacks.New()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ft := configs.DefaultFaultTolerance()
			ft.CalculateTimeouts = false
			var mu sync.Mutex
			var dismissed []eventlog.HangDismissedEvent
			m := startManager(t, Options{NLocal: 3, FT: ft, MinComputedTimeout: -1, Stacks: c,
				OnEvent: func(rec eventlog.Record) {
					if d, ok := rec.(eventlog.HangDismissedEvent); ok {
						mu.Lock()
						dismissed = append(dismissed, d)
						mu.Unlock()
					}
				}})
			procs := startGlooRanks(t, m, c, "testdata/stall_kinds.py", kind)
			if kind == "lock" {
				h := waitHang(t, m, 90*time.Second)
				if h.LocalRank != 1 || !h.DefaultTimeout || h.Judgement == nil || !h.Judgement.Finding.Known {
					t.Fatalf("hang %+v: want local rank 1 on its default clock, judged", h)
				}
				since := h.SignalledAt.Sub(h.LastHeartbeat)
				t.Logf("killed %s after its last heartbeat (clock %s): %s", since, h.Timeout, h.Judgement.Finding.Text)
				// The judged clock, not the 60 s floor of the unjudged one
				// (its value follows the steps, slower on a loaded machine).
				if h.Timeout >= configs.DefaultLearnedFloor {
					t.Errorf("learned clock %s: want the short judged one", h.Timeout)
				}
				return
			}
			for lr, p := range procs {
				if st := p.exited(t, 120*time.Second); !st.Success() {
					t.Errorf("rank %d: %v, want exit 0", lr, st)
				}
			}
			noHang(t, m, 100*time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if len(dismissed) == 0 {
				t.Fatalf("no hang_dismissed record: the stall never reached the clock")
			}
			for _, d := range dismissed {
				t.Logf("dismissed after %.2fs silent (%.0f ms), waits %.1fs: %s", d.SilentS, d.TookMS, d.WaitS, d.Why)
			}
		})
	}
}

// startGlooRanks starts 3 ranks of m running script with a free port and
// args (a 3-rank gloo group on 127.0.0.1, the stacks hook of c on their
// PYTHONPATH) and begins cycle 0 with them.
func startGlooRanks(t *testing.T, m *Manager, c *stacks.Collector, script string, args ...string) map[int]*rankProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	pids := map[int]int{}
	procs := map[int]*rankProc{}
	for lr := range 3 {
		env := append(c.Env(append(os.Environ(), pyEnv(t)...)), fmt.Sprintf("RANK=%d", lr), fmt.Sprintf("LOCAL_RANK=%d", lr),
			"FT_RANK_MONITOR_IPC_SOCKET="+m.RankSocket(lr))
		procs[lr] = startProcEnv(t, env, append([]string{python, script, port}, args...)...)
		pids[lr] = procs[lr].cmd.Process.Pid
	}
	m.BeginCycle(0, pids)
	return procs
}

// TestSteadyInterval: the judged clock learns from the third longest of
// the latest intervals, so two outliers (a save, an evaluation) do not
// lengthen it and a third does; the window forgets old ones.
func TestSteadyInterval(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	for _, tc := range []struct {
		name string
		ivs  []int64
		want int64
	}{
		{"one", []int64{ms(40)}, ms(40)},
		{"two: the shorter", []int64{ms(40), ms(900)}, ms(40)},
		// Past the first 32 it is recomputed every 32nd interval: each
		// list below ends on one (96, 288 intervals).
		{"two outliers among steps", append(rep(ms(40), 94), ms(30000), ms(20000)), ms(40)},
		{"three outliers", append(rep(ms(40), 93), ms(30000), ms(20000), ms(2000)), ms(2000)},
		{"outliers forgotten after the window", append([]int64{ms(30000), ms(20000), ms(2000)}, rep(ms(50), 285)...), ms(50)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &rankMon{}
			for _, iv := range tc.ivs {
				r.steadyInterval(iv)
			}
			if got := r.steadyIv.Load(); got != tc.want {
				t.Errorf("steadyIv %v, want %v", time.Duration(got), time.Duration(tc.want))
			}
		})
	}
}

func rep(v int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestJudgedWaitsForTheJudgement: a node whose round ends while its own
// judgement is still being made (its stacks shared, the others' awaited)
// gets that judgement once made, not nothing; a judgement never finished
// is given up after its bound, and one that found no hang is none.
func TestJudgedWaitsForTheJudgement(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cycle     int           // asked for; the judgement is of cycle 3
		finishIn  time.Duration // <0: never finished
		dismissed string
		want      bool
		// bound is the stacks bound: the wait is it plus 1.3 s, long
		// beside the 0.2 s a judgement takes here, on a machine at any load.
		bound time.Duration
	}{
		{"made while waiting", 3, 200 * time.Millisecond, "", true, 10 * time.Second},
		{"made already", 3, 0, "", true, 10 * time.Second},
		{"another cycle's", 2, 0, "", false, 10 * time.Second},
		{"found no hang", 3, 100 * time.Millisecond, "busy", false, 10 * time.Second},
		{"never made", 3, -1, "", false, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m := &Manager{ctx: ctx, opts: Options{StacksBound: tc.bound}}
			jd := &judgement{cycle: 3, done: make(chan struct{})}
			m.judged = jd
			if tc.finishIn >= 0 {
				time.AfterFunc(tc.finishIn, func() {
					jd.j = Judgement{Cycle: 3, Dismissed: tc.dismissed, Finding: stacks.Finding{Known: true, Culprits: []int{1}}}
					close(jd.done)
				})
			}
			j, ok := m.Judged(ctx, tc.cycle)
			if ok != tc.want {
				t.Fatalf("Judged(%d) = %v, %v; want ok %v", tc.cycle, j, ok, tc.want)
			}
			if ok && (j.Cycle != 3 || !j.Finding.Known) {
				t.Errorf("judgement %+v, want cycle 3's", j)
			}
		})
	}
}
