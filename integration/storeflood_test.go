package integration

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// floodStats are what the flood saw of its connections.
type floodStats struct {
	mu     sync.Mutex
	opened map[string]int
	closed map[string][]time.Duration // closed by the server, after
	failed map[string]int             // connect refused or reset before anything
	start  time.Time                  // first wave
	end    time.Time                  // every connection ended
}

func (f *floodStats) add(kind string, took time.Duration, closedByServer bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened[kind]++
	if closedByServer {
		f.closed[kind] = append(f.closed[kind], took)
	}
}

// flood opens, every 100 ms until stop or the budget is spent, a wave of 30
// connections to the store at addr, all on loopback: idle ones and
// half-open ones (two bytes of VALIDATE, then nothing) from 127.0.0.1, a
// job node's address, and complete torch 2.x handshakes from 127.0.0.77,
// which is not a node of the job. Each is held until the server closes it
// (or 60 s).
func flood(addr string, stop <-chan struct{}, budget int, st *floodStats) {
	var wg sync.WaitGroup
	defer wg.Wait()
	one := func(kind, src string, first []byte) {
		defer wg.Done()
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		start := time.Now()
		c, err := d.Dial("tcp", addr)
		if err != nil {
			st.mu.Lock()
			st.failed[kind]++
			st.mu.Unlock()
			return
		}
		defer c.Close()
		if len(first) > 0 {
			_, _ = c.Write(first)
		}
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		_, err = bufio.NewReader(c).ReadByte()
		for err == nil { // a PING answer, say: read on until the close
			_, err = bufio.NewReader(c).ReadByte()
		}
		var ne net.Error
		st.add(kind, time.Since(start), !(errors.As(err, &ne) && ne.Timeout()))
	}
	validate := binary.LittleEndian.AppendUint32([]byte{0}, 0x3C85F7CE)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for sent := 0; sent < budget; sent += 30 {
		for range 10 {
			wg.Add(3)
			go one("idle", "127.0.0.1", nil)
			go one("half-open", "127.0.0.1", validate[:2])
			go one("non-member", "127.0.0.77", validate)
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

var initTookRE = regexp.MustCompile(`cycle=(\d+)\] init_process_group took ([0-9.]+)s`)

// initTimes are the init_process_group times the ranks logged, by cycle.
func initTimes(out string) map[int][]float64 {
	m := map[int][]float64{}
	for _, g := range initTookRE.FindAllStringSubmatch(out, -1) {
		c, _ := strconv.Atoi(g[1])
		v, _ := strconv.ParseFloat(g[2], 64)
		m[c] = append(m[c], v)
	}
	return m
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1))]
}

// TestAgentStoreFloodDuringRestart: torch 1.13 DDP ranks (2, gloo) on one
// node; rank 0 crashes at step 25. From the moment the launcher serves the
// store until the job ends (at most 90 s and 12,000 connections, 300 a
// second), the store is flooded with idle and half-open connections from
// 127.0.0.1 and with complete handshakes from 127.0.0.77, not a node of
// the job; the flood must cover the restart and round 1's start. The ranks
// of both rounds still form their group, the job ends with the
// uninterrupted run's weights after exactly the one restart the crash
// spent, the verdict is a success, and every flood connection was closed
// by the store: the non-member's at once, the others within the handshake
// timeout or sooner, to make room. The quiet run is the same job without
// the flood, for the init_process_group times (docs/benchmarks-history.md,
// "Store under a flood").
func TestAgentStoreFloodDuringRestart(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	ref := referenceWeights(t)
	for _, withFlood := range []bool{false, true} {
		name := "quiet"
		if withFlood {
			name = "flood"
		}
		t.Run(name, func(t *testing.T) {
			j := newJob(t)
			out := filepath.Join(j.dir, "w.json")
			vpath := filepath.Join(j.dir, "verdict.json")
			st := &floodStats{opened: map[string]int{}, closed: map[string][]time.Duration{}, failed: map[string]int{}}
			stop := make(chan struct{})
			var fwg sync.WaitGroup
			j.start([]string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", nranks, "--max-restarts", "2",
				"--verdict-file", vpath, trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
				"--crash-at-step", "25", "--crash-rank", "0")
			if withFlood {
				fwg.Add(1)
				go func() {
					defer fwg.Done()
					addr := ""
					for deadline := time.Now().Add(2 * time.Minute); addr == "" && time.Now().Before(deadline); {
						if evs, err := eventlog.Read(j.events); err == nil {
							for _, e := range evs {
								if e["event"] == "agent_store_served" {
									addr, _ = e["addr"].(string)
								}
							}
						}
						select {
						case <-stop:
							return
						case <-time.After(20 * time.Millisecond):
						}
					}
					if addr == "" {
						return
					}
					done := make(chan struct{})
					go func() {
						select {
						case <-stop:
						case <-time.After(90 * time.Second):
						}
						close(done)
					}()
					st.mu.Lock()
					st.start = time.Now()
					st.mu.Unlock()
					flood(addr, done, 12000, st)
					st.mu.Lock()
					st.end = time.Now()
					st.mu.Unlock()
				}()
			}
			code := j.wait(torchTimeout)
			close(stop)
			fwg.Wait()
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, j.stderr.String())
			}
			w := readWeights(t, out)
			if w.SHA256 != ref.SHA256 || w.ResumedFromStep != 20 {
				t.Fatalf("weights %s resumed from step %d; want the uninterrupted run's %s, resumed from 20", w.SHA256, w.ResumedFromStep, ref.SHA256)
			}
			if n := len(j.eventsOf("restart")); n != 1 {
				t.Fatalf("%d restart events, want the crash's 1: the flood spent a restart\n%s", n, j.stderr.String())
			}
			v := readVerdict(t, vpath)
			wantVerdict(t, v, verdict.Succeeded, 0)
			if v.LastRound != 1 {
				t.Fatalf("verdict's last round %d, want 1", v.LastRound)
			}
			inits := initTimes(j.stderr.String())
			if len(inits[0]) != 2 || len(inits[1]) != 2 {
				t.Fatalf("init_process_group times by cycle %v, want both ranks in cycles 0 and 1", inits)
			}
			t.Logf("%s: init_process_group seconds, cycle 0 %v, cycle 1 (after the crash) %v", name, inits[0], inits[1])
			if !withFlood {
				return
			}
			closed := j.eventsOf("agent_store_closed")
			if len(closed) != 1 {
				t.Fatalf("agent_store_closed events %v, want 1", closed)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			// The flood covered the restart: the crash's round end and the
			// start of round 1's ranks, whose group formed under it.
			for _, e := range append(j.eventsOf("restart"), j.eventsOf("cycle_started")...) {
				if e["event"] == "cycle_started" && e["round"] != float64(1) {
					continue
				}
				ts, err := time.Parse(time.RFC3339Nano, e["ts"].(string))
				if err != nil || ts.Before(st.start) || ts.After(st.end) {
					t.Fatalf("%s at %v (%v), outside the flood (%v to %v)", e["event"], ts, err, st.start, st.end)
				}
			}
			total := 0
			for _, kind := range []string{"idle", "half-open", "non-member"} {
				n, c := st.opened[kind], st.closed[kind]
				total += n
				t.Logf("flood %s: %d opened, %d closed by the store (median %v, p99 %v, max %v), %d failed to connect",
					kind, n, len(c), quantile(c, 0.5), quantile(c, 0.99), quantile(c, 1), st.failed[kind])
				if n == 0 || len(c) != n {
					t.Errorf("flood %s: %d of %d connections closed by the store", kind, len(c), n)
				}
				// Generous: the handshake timeout is 5 s; the non-member is
				// refused before a byte is read.
				if limit := 30 * time.Second; quantile(c, 1) > limit {
					t.Errorf("flood %s: a connection stayed %v, over %v", kind, quantile(c, 1), limit)
				}
			}
			t.Logf("store at exit: %v", closed[0])
			if r, _ := closed[0]["refused"].(float64); r <= 0 || total < 300 {
				t.Errorf("store refused %v of %d flood connections", closed[0]["refused"], total)
			}
		})
	}
}
