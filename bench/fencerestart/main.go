// Command fencerestart measures how fast a dead fence watchdog is replaced
// (package fence), with the real ft-launcher binary as the watchdog. Each
// run guards one rank (sleep 600, in a process group of its own), sets a
// deadline 5 ms ahead and SIGKILLs the watchdog at once, so the deadline
// passes while no watchdog runs: the successor must kill the rank as soon
// as it has read the state it was given. Per run:
//
//   - restart: the launcher side's Restart.Downtime, from the death's
//     reaping to the successor forked with the state in its pipe;
//   - kill->restarted: SIGKILL -> OnRestart (reaping included);
//   - kill->fenced: SIGKILL -> the rank reaped, killed by the successor:
//     protection effective again (the successor's exec and start included).
//
// The anchor is a fresh watchdog doing the same from its start (Start ->
// the rank reaped, its deadline already past): what any restart must pay
// for exec and start.
//
//	go build -o /tmp/ftl/ ./cmd/ft-launcher && go run ./bench/fencerestart -launcher /tmp/ftl/ft-launcher -n 20
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/fence"
	"github.com/ftlauncher/ft-launcher/spawn"
)

func main() {
	launcher := flag.String("launcher", "", "the ft-launcher binary (its watchdog mode is what runs)")
	n := flag.Int("n", 20, "runs")
	flag.Parse()
	if *launcher == "" {
		fmt.Fprintln(os.Stderr, "fencerestart: -launcher is required: the path of an ft-launcher binary")
		os.Exit(2)
	}
	r, err := spawn.NewReaper(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer r.Close()
	argv := []string{*launcher, fence.ModeArg}
	var restart, restarted, fenced, anchor []time.Duration
	for i := 0; i < *n; i++ {
		a, err := fresh(r, argv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "anchor:", err)
			os.Exit(1)
		}
		anchor = append(anchor, a)
		d, err := once(r, argv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "run:", err)
			os.Exit(1)
		}
		restart, restarted, fenced = append(restart, d[0]), append(restarted, d[1]), append(fenced, d[2])
	}
	fmt.Printf("%d runs (ms)                 median   worst\n", *n)
	for _, row := range []struct {
		name string
		d    []time.Duration
	}{{"restart (reaped -> forked + state)", restart}, {"kill -> restarted", restarted},
		{"kill -> fenced by the successor", fenced}, {"anchor: start -> fenced", anchor}} {
		slices.Sort(row.d)
		fmt.Printf("%-36s %7.1f %7.1f\n", row.name, ms(row.d[len(row.d)/2]), ms(row.d[len(row.d)-1]))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rank starts one sleeping rank in a process group of its own.
func rank(r *spawn.Reaper) (*spawn.Group, int, error) {
	g, err := r.StartGroup([]spawn.Spec{{LocalRank: 0, Argv: []string{"sleep", "600"}}})
	if err != nil {
		return nil, 0, err
	}
	return g, g.PIDs()[0], nil
}

// once is one SIGKILL of a guarded, armed watchdog: restart, kill ->
// restarted, kill -> fenced.
func once(r *spawn.Reaper, argv []string) ([3]time.Duration, error) {
	var out [3]time.Duration
	g, pgid, err := rank(r)
	if err != nil {
		return out, err
	}
	defer g.Stop(syscall.SIGKILL, 0)
	restarts := make(chan fence.Restart, 1)
	var killed time.Time
	wd, err := fence.Start(r, fence.Options{Argv: argv, OnRestart: func(rs fence.Restart) {
		out[1] = time.Since(killed)
		restarts <- rs
	}})
	if err != nil {
		return out, err
	}
	defer wd.Close()
	time.Sleep(300 * time.Millisecond) // the watchdog serves
	wd.Guard(pgid)
	wd.Extend(time.Now().Add(5 * time.Millisecond))
	killed = time.Now()
	if err := syscall.Kill(wd.PID(), syscall.SIGKILL); err != nil {
		return out, err
	}
	select {
	case rs := <-restarts:
		out[0] = rs.Downtime
	case <-time.After(30 * time.Second):
		return out, fmt.Errorf("no restart within 30 s")
	}
	select {
	case e := <-g.Exits():
		if e.Signal != syscall.SIGKILL {
			return out, fmt.Errorf("rank %s, want killed by the successor", e)
		}
		out[2] = e.At.Sub(killed)
	case <-time.After(30 * time.Second):
		return out, fmt.Errorf("the successor did not fence within 30 s")
	}
	return out, nil
}

// fresh is the anchor: a watchdog started with a guarded rank and a
// deadline already past; Start -> the rank reaped.
func fresh(r *spawn.Reaper, argv []string) (time.Duration, error) {
	g, pgid, err := rank(r)
	if err != nil {
		return 0, err
	}
	defer g.Stop(syscall.SIGKILL, 0)
	t0 := time.Now()
	wd, err := fence.Start(r, fence.Options{Argv: argv})
	if err != nil {
		return 0, err
	}
	defer wd.Close()
	wd.Guard(pgid)
	wd.Extend(time.Now().Add(-time.Millisecond))
	select {
	case e := <-g.Exits():
		return e.At.Sub(t0), nil
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("a fresh watchdog did not fence within 30 s")
	}
}
