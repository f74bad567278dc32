package monitor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/ftclient"
)

// The test binary re-executes itself as a rank when FTL_HELPER is set: the
// variable holds a ';'-separated script of client actions (see runHelper).
func TestMain(m *testing.M) {
	if s := os.Getenv("FTL_HELPER"); s != "" {
		os.Exit(runHelper(s))
	}
	os.Exit(m.Run())
}

// runHelper interprets a rank script:
//
//	connect | connectsock | connectold | shm | ring | hb | hbn N PERIOD | open NAME [ITER] | close NAME | closeall |
//	sleep DUR | busy DUR | writes DUR | ignoreterm | disconnect | mark TEXT | exit CODE
func runHelper(script string) int {
	var c *ftclient.Client
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 3
	}
	for _, stmt := range strings.Split(script, ";") {
		f := strings.Fields(stmt)
		if len(f) == 0 {
			continue
		}
		var err error
		switch f[0] {
		case "connect":
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			c, err = ftclient.Connect(ctx)
			cancel()
		case "connectsock": // socket heartbeats, as clients before shm
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			c, err = ftclient.ConnectPath(ctx, os.Getenv(ftclient.EnvSocket), ftclient.Options{
				GlobalRank: -1, LocalRank: -1, SocketHeartbeats: true})
			cancel()
		case "connectold": // socket section events, as clients before the ring
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			c, err = ftclient.ConnectPath(ctx, os.Getenv(ftclient.EnvSocket), ftclient.Options{
				GlobalRank: -1, LocalRank: -1, SocketSections: true})
			cancel()
		case "shm":
			fmt.Printf("shm=%v\n", c.SharedMemory())
		case "ring":
			fmt.Printf("ring=%v\n", c.SectionRing())
		case "hb":
			err = c.SendHeartbeat()
		case "hbn":
			n, _ := strconv.Atoi(f[1])
			d, _ := time.ParseDuration(f[2])
			for i := 0; i < n && err == nil; i++ {
				err = c.SendHeartbeat()
				time.Sleep(d)
			}
		case "open":
			if len(f) > 2 {
				it, _ := strconv.ParseInt(f[2], 10, 64)
				err = c.StartSectionAt(f[1], it)
			} else {
				err = c.StartSection(f[1])
			}
		case "close":
			err = c.EndSection(f[1])
		case "closeall":
			err = c.EndAllSections()
		case "sleep":
			d, _ := time.ParseDuration(f[1])
			time.Sleep(d)
		case "busy": // compute, as a rank in an evaluation or a compilation
			d, _ := time.ParseDuration(f[1])
			for end := time.Now().Add(d); time.Now().Before(end); {
			}
		case "writes": // write with little CPU, as a rank saving a checkpoint to slow storage
			d, _ := time.ParseDuration(f[1])
			err = writeFor(d)
		case "ignoreterm":
			signal.Ignore(syscall.SIGTERM)
		case "disconnect":
			err = c.Close()
		case "mark":
			fmt.Println(strings.Join(f[1:], " "))
		case "exit":
			n, _ := strconv.Atoi(f[1])
			return n
		default:
			err = fmt.Errorf("unknown statement %q", stmt)
		}
		if err != nil {
			return fail(err)
		}
	}
	return 0
}

// writeFor writes 256 KiB to /dev/null every 20 ms for d.
func writeFor(d time.Duration) error {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 256<<10)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, err := f.Write(buf); err != nil {
			return err
		}
	}
	return nil
}

// rankProc is a child process playing a rank.
type rankProc struct {
	cmd   *exec.Cmd
	done  chan struct{}
	state *os.ProcessState
	lines chan string
}

// exited waits for the process to end.
func (p *rankProc) exited(t *testing.T, within time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-p.done:
		return p.state
	case <-time.After(within):
		t.Fatalf("rank process %d still running after %v", p.cmd.Process.Pid, within)
		return nil
	}
}

func (p *rankProc) waitLine(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("rank output ended before %q", want)
			}
			if l == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q from rank within %v", want, within)
		}
	}
}

// startProc starts argv as a process-group leader with the rank env of
// local rank 0 of m, and cleans it up.
func startProc(t *testing.T, m *Manager, env []string, argv ...string) *rankProc {
	t.Helper()
	return startProcEnv(t, append(append(os.Environ(), "FT_RANK_MONITOR_IPC_SOCKET="+m.RankSocket(0),
		"FT_LAUNCHER_IPC_SOCKET="+m.LauncherSocket(), "RANK=7", "LOCAL_RANK=0"), env...), argv...)
}

// startProcEnv starts argv with exactly env as a process-group leader,
// and cleans it up.
func startProcEnv(t *testing.T, env []string, argv ...string) *rankProc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = testWriter{t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &rankProc{cmd: cmd, done: make(chan struct{}), lines: make(chan string, 64)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		p.state = cmd.ProcessState
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

// startRank runs the test binary as a rank executing script.
func startRank(t *testing.T, m *Manager, script string) *rankProc {
	t.Helper()
	return startProc(t, m, []string{"FTL_HELPER=" + script}, os.Args[0], "-test.run=^$")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	// Every test also checks the phase machine: no path may break it.
	if strings.Contains(string(p), "illegal phase transition") {
		w.t.Errorf("%s", p)
	}
	return len(p), nil
}

// noSuchPID is PID_MAX_LIMIT: no process ever has it, so a rank registered
// with it can be declared hung without signalling anything.
const noSuchPID = 1 << 22

func fptr(v float64) *float64 { return &v }

// newManager creates a Manager with a test logger; mut edits the FT config.
func newManager(t *testing.T, nlocal int, mut func(*configs.FaultTolerance), stateFile string) *Manager {
	t.Helper()
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	if mut != nil {
		mut(&ft)
	}
	return startManager(t, Options{NLocal: nlocal, FT: ft, StateFile: stateFile, MinComputedTimeout: -1})
}

// startManager creates a Manager from o with a logger writing to the test
// log, closed when the test ends.
func startManager(t *testing.T, o Options) *Manager {
	t.Helper()
	o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m
}

func waitHang(t *testing.T, m *Manager, within time.Duration) Hang {
	t.Helper()
	select {
	case h := <-m.Hangs():
		return h
	case <-time.After(within):
		t.Fatalf("no hang reported within %v", within)
		return Hang{}
	}
}

func noHang(t *testing.T, m *Manager, during time.Duration) {
	t.Helper()
	select {
	case h := <-m.Hangs():
		t.Fatalf("unexpected hang: %+v", h)
	case <-time.After(during):
	}
}

func signalOf(st *os.ProcessState) syscall.Signal {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
