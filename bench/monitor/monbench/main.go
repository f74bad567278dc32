// Command monbench measures ft-launcher's rank monitors with real processes
// and real Unix sockets (results go to docs/benchmarks.md, "Rank monitors: overhead and detection latency").
//
//	monbench client CMD [ARGS...]      run CMD as local rank 0 of a live monitor; print its stdout
//	monbench hang [-n 200] [-par 4] [-timeout 300ms]
//	                                   hang-detection latency over real rank processes
//	monbench rank hb RATE DURATION     (child) connect, heartbeat at RATE Hz for DURATION, exit 0
//	monbench rank hang N               (child) connect, N heartbeats 1 ms apart, print the last one's time, block
//	monbench wcost [-n 200000]         cost of a 1-byte write(2) on a Unix stream socket, with and without a waiting reader
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/ftclient"
	"github.com/ftlauncher/ft-launcher/monitor"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: monbench client|hang|rank|wcost ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "client":
		err = runClient(os.Args[2:])
	case "hang":
		err = runHang(os.Args[2:])
	case "rank":
		err = runRank(os.Args[2:])
	case "wcost":
		err = runWriteCost(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "monbench:", err)
		os.Exit(1)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runClient starts a one-rank Manager (no timeouts armed) and runs argv as
// its rank: the admission check needs the rank's pid registered first.
func runClient(argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("client: missing command")
	}
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	m, err := monitor.New(monitor.Options{NLocal: 1, FT: ft, Logger: quietLogger()})
	if err != nil {
		return err
	}
	defer m.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "FT_RANK_MONITOR_IPC_SOCKET="+m.RankSocket(0),
		"FT_LAUNCHER_IPC_SOCKET="+m.LauncherSocket(), "RANK=0", "LOCAL_RANK=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", argv[0], err)
	}
	m.BeginCycle(0, map[int]int{0: cmd.Process.Pid})
	err = cmd.Wait()
	st := m.RankStatus(0)
	fmt.Fprintf(os.Stderr, "monbench: monitor counted %d heartbeats, section closes %v\n", st.Heartbeats, st.SectionCloses)
	if err != nil {
		return fmt.Errorf("client %s: %w", argv[0], err)
	}
	return nil
}

// runHang measures hang detection: each trial is a real rank process that
// heartbeats, reports the wall time of its last heartbeat, then blocks.
// Internal latency is Hang.SignalledAt − Hang.ExpiredAt; external latency is
// the time the parent observes the child's death (wait4 returns) minus
// (child's last heartbeat + timeout).
func runHang(args []string) error {
	fs := flag.NewFlagSet("hang", flag.ContinueOnError)
	n := fs.Int("n", 200, "number of hangs")
	par := fs.Int("par", 4, "concurrent ranks (one Manager with this many local ranks)")
	timeout := fs.Duration("timeout", 300*time.Millisecond, "rank heartbeat timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	to := timeout.Seconds()
	ft.InitialRankHeartbeatTimeout = &to
	ft.RankHeartbeatTimeout = &to
	ft.RankSectionTimeouts = map[string]*float64{}
	ft.RankOutOfSectionTimeout = nil
	ft.RankTerminationSignal = syscall.SIGKILL
	m, err := monitor.New(monitor.Options{NLocal: *par, FT: ft, Logger: quietLogger(), MinComputedTimeout: -1})
	if err != nil {
		return err
	}
	defer m.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var internal, external []time.Duration
	for done, cycle := 0, 0; done < *n; cycle++ {
		k := min(*par, *n-done)
		type res struct {
			last, exited time.Time
			err          error
		}
		results := make([]res, k)
		cmds := make([]*exec.Cmd, k)
		outs := make([]*bufio.Reader, k)
		pids := map[int]int{}
		for i := 0; i < k; i++ {
			c := exec.Command(self, "rank", "hang", "20")
			c.Env = append(os.Environ(), "FT_RANK_MONITOR_IPC_SOCKET="+m.RankSocket(i), "RANK="+strconv.Itoa(i), "LOCAL_RANK="+strconv.Itoa(i))
			c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			c.Stderr = os.Stderr
			out, err := c.StdoutPipe()
			if err != nil {
				return err
			}
			if err := c.Start(); err != nil {
				return err
			}
			cmds[i], outs[i] = c, bufio.NewReader(out)
			pids[i] = c.Process.Pid
		}
		m.BeginCycle(cycle, pids)
		var wg sync.WaitGroup
		for i := 0; i < k; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				line, err := outs[i].ReadString('\n')
				if err == nil {
					ns, perr := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
					results[i].last, err = time.Unix(0, ns), perr
				}
				_, _ = io.Copy(io.Discard, outs[i])
				werr := cmds[i].Wait()
				results[i].exited = time.Now()
				if err == nil && (werr == nil || !strings.Contains(werr.Error(), "killed")) {
					err = fmt.Errorf("rank %d: not killed: %v", i, werr)
				}
				results[i].err = err
			}()
		}
		hangs := map[int]monitor.Hang{}
		deadline := time.After(30 * time.Second)
		for len(hangs) < k {
			select {
			case h := <-m.Hangs():
				if h.Cycle == cycle {
					hangs[h.LocalRank] = h
				}
			case <-deadline:
				for _, c := range cmds {
					_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
				}
				return fmt.Errorf("cycle %d: only %d of %d hangs reported", cycle, len(hangs), k)
			}
		}
		wg.Wait()
		m.EndCycle()
		for i := 0; i < k; i++ {
			if results[i].err != nil {
				return results[i].err
			}
			h := hangs[i]
			if h.Kind != monitor.KindHeartbeat {
				return fmt.Errorf("rank %d: hang kind %q, want heartbeat", i, h.Kind)
			}
			internal = append(internal, h.SignalledAt.Sub(h.ExpiredAt))
			external = append(external, results[i].exited.Sub(results[i].last.Add(*timeout)))
		}
		done += k
	}
	fmt.Printf("hangs=%d par=%d timeout=%v\n", *n, *par, *timeout)
	fmt.Printf("internal (SignalledAt-ExpiredAt): %s\n", summary(internal))
	fmt.Printf("external (child exit seen - (last heartbeat + timeout)): %s\n", summary(external))
	return nil
}

func summary(d []time.Duration) string {
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return fmt.Sprintf("min=%v p50=%v p90=%v p99=%v max=%v", d[0], q(0.5), q(0.9), q(0.99), d[len(d)-1])
}

func runRank(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("rank: want hb RATE DURATION | hang N")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c, err := ftclient.Connect(ctx)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	switch args[0] {
	case "hb":
		if len(args) < 3 {
			return fmt.Errorf("rank hb: want RATE DURATION")
		}
		rate, err := strconv.Atoi(args[1])
		if err != nil || rate <= 0 {
			return fmt.Errorf("rank hb: bad rate %q", args[1])
		}
		dur, err := time.ParseDuration(args[2])
		if err != nil {
			return err
		}
		// Paced against absolute times so sleep overshoot does not lower the rate.
		period := time.Second / time.Duration(rate)
		start := time.Now()
		for i := 1; ; i++ {
			if err := c.SendHeartbeat(); err != nil {
				return err
			}
			next := start.Add(time.Duration(i) * period)
			if next.Sub(start) >= dur {
				return nil
			}
			time.Sleep(time.Until(next))
		}
	case "hang":
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		var last time.Time
		for i := 0; i < n; i++ {
			if i > 0 {
				time.Sleep(time.Millisecond)
			}
			if err := c.SendHeartbeat(); err != nil {
				return err
			}
			last = time.Now() // after the write returned: the monitor cannot have seen it later than this
		}
		fmt.Println(last.UnixNano())
		select {} // hang until killed
	}
	return fmt.Errorf("rank: unknown behaviour %q", args[0])
}

// runWriteCost separates the cost of the write(2) itself from the cost of
// waking the reader: the same 1-byte write on a socketpair whose other end
// is (a) not being read (no waiter; drained between batches), (b) read by a
// goroutine blocked in the netpoller (epoll: the write wakes it), (c) read by
// a thread blocked in read(2).
func runWriteCost(args []string) error {
	fs := flag.NewFlagSet("wcost", flag.ContinueOnError)
	n := fs.Int("n", 200000, "writes per case")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pair := func() (int, int, error) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return fds[0], fds[1], err
	}
	one := []byte{1}
	{
		w, r, err := pair()
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<16)
		const batch = 64 // 1-byte skbs cost ~1 KiB of sndbuf each: stay well under it so write never blocks
		var total time.Duration
		for done := 0; done < *n; done += batch {
			t0 := time.Now()
			for i := 0; i < batch; i++ {
				if _, err := unix.Write(w, one); err != nil {
					return err
				}
			}
			total += time.Since(t0)
			for got := 0; got < batch; {
				k, err := unix.Read(r, buf)
				if err != nil {
					return err
				}
				got += k
			}
		}
		fmt.Printf("no waiting reader:          %6.2f µs/write\n", total.Seconds()*1e6/float64(*n))
		unix.Close(w)
		unix.Close(r)
	}
	reader := func(name string, read func(r int) (func(), error)) error {
		w, r, err := pair()
		if err != nil {
			return err
		}
		stop, err := read(r)
		if err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
		t0 := time.Now()
		for i := 0; i < *n; i++ {
			if _, err := unix.Write(w, one); err != nil {
				return err
			}
		}
		el := time.Since(t0)
		fmt.Printf("%-27s %6.2f µs/write\n", name+":", el.Seconds()*1e6/float64(*n))
		unix.Close(w)
		stop()
		return nil
	}
	if err := reader("netpoller reader (Go conn)", func(r int) (func(), error) {
		// Non-blocking, so os.NewFile registers it with the netpoller.
		if err := unix.SetNonblock(r, true); err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(r), "r")
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 4096)
			for {
				if _, err := f.Read(buf); err != nil {
					return
				}
			}
		}()
		return func() { <-done; f.Close() }, nil
	}); err != nil {
		return err
	}
	return reader("blocking read(2) thread", func(r int) (func(), error) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 4096)
			for {
				k, err := unix.Read(r, buf)
				if err == unix.EINTR {
					continue
				}
				if err != nil || k == 0 {
					return
				}
			}
		}()
		return func() { <-done; unix.Close(r) }, nil
	})
}
