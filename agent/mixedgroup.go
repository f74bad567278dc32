package agent

// The ranks of an in-process round (mixedGroup), and what the agent does
// to one rank of any group: signal it, tell whether it is ending or
// stopped.

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// rankSignaler signals one rank's process group (*spawn.Group, mixedGroup).
type rankSignaler interface {
	Signal(localRank int, sig syscall.Signal) error
}

// mixedGroup is the ranks of an in-process round: survivors from an older
// group and the ranks started for this round (and, when a survivor did
// not rejoin, the rank that replaced it). Each local rank belongs to the
// group that runs it now; exits of ranks an older group no longer runs
// (the failed ones, a replaced survivor) are not delivered.
type mixedGroup struct {
	mu       sync.Mutex
	parts    []RankGroup
	owner    map[int]RankGroup // local rank -> the part that runs it now
	exits    chan spawn.Exit   // nil until Exits
	quit     chan struct{}     // closed by Stop: the forwarders end
	stopOnce sync.Once
}

func newMixedGroup() *mixedGroup {
	return &mixedGroup{owner: map[int]RankGroup{}, quit: make(chan struct{})}
}

// add makes g the group that runs ranks from now on; exits of those ranks
// from the group that ran them before are dropped.
func (m *mixedGroup) add(g RankGroup, ranks []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.parts, g) {
		m.parts = append(m.parts, g)
		if m.exits != nil {
			m.forward(g)
		}
	}
	for _, lr := range ranks {
		m.owner[lr] = g
	}
}

// ownerOf is the part that runs local rank lr now (nil: none).
func (m *mixedGroup) ownerOf(lr int) RankGroup {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owner[lr]
}

// PIDs maps each local rank to the pid that runs it now.
func (m *mixedGroup) PIDs() map[int]int {
	m.mu.Lock()
	owner := maps.Clone(m.owner)
	m.mu.Unlock()
	out := map[int]int{}
	for lr, g := range owner {
		if pid, ok := g.PIDs()[lr]; ok {
			out[lr] = pid
		}
	}
	return out
}

// Exits merges the parts' exits of the ranks they run now.
func (m *mixedGroup) Exits() <-chan spawn.Exit {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exits == nil {
		m.exits = make(chan spawn.Exit, 64)
		for _, g := range m.parts {
			m.forward(g)
		}
	}
	return m.exits
}

// forward delivers g's exits of the ranks it runs now. Caller holds m.mu.
func (m *mixedGroup) forward(g RankGroup) {
	src, out, quit := g.Exits(), m.exits, m.quit
	go func() {
		for {
			select {
			case e := <-src:
				if m.ownerOf(e.LocalRank) != g {
					continue
				}
				select {
				case out <- e:
				case <-quit:
					return
				}
			case <-quit:
				return
			}
		}
	}()
}

// Stop stops every part at once and reports the current ranks' exits.
func (m *mixedGroup) Stop(sig syscall.Signal, grace time.Duration) spawn.StopResult {
	m.mu.Lock()
	parts := slices.Clone(m.parts)
	owner := maps.Clone(m.owner)
	m.mu.Unlock()
	res := make([]spawn.StopResult, len(parts))
	var wg sync.WaitGroup
	for i, g := range parts {
		wg.Go(func() { res[i] = g.Stop(sig, grace) })
	}
	wg.Wait()
	m.stopOnce.Do(func() { close(m.quit) })
	var out spawn.StopResult
	for i, g := range parts {
		for _, e := range res[i].Exits {
			if owner[e.LocalRank] == g {
				out.Exits = append(out.Exits, e)
			}
		}
		for _, lr := range res[i].Escalated {
			if owner[lr] == g {
				out.Escalated = append(out.Escalated, lr)
			}
		}
		out.Leftover = append(out.Leftover, res[i].Leftover...)
	}
	slices.SortFunc(out.Exits, func(x, y spawn.Exit) int { return x.LocalRank - y.LocalRank })
	return out
}

// SignalAll signals every current rank.
func (m *mixedGroup) SignalAll(sig syscall.Signal) {
	for lr := range m.PIDs() {
		_ = m.Signal(lr, sig)
	}
}

// Signal signals one current rank's process group.
func (m *mixedGroup) Signal(localRank int, sig syscall.Signal) error {
	if g := m.ownerOf(localRank); g != nil {
		return signalRank(g, localRank, sig)
	}
	return fmt.Errorf("no local rank %d in the group", localRank)
}

// Ending reports whether the process of a current rank has ended or is
// ending (rankEnding).
func (m *mixedGroup) Ending(localRank int) bool {
	g := m.ownerOf(localRank)
	return g == nil || rankEnding(g, localRank)
}

// rankEnder is a group that can tell a rank whose exit is not delivered
// yet has ended or is ending (*spawn.Group, mixedGroup).
type rankEnder interface {
	Ending(localRank int) bool
}

// rankEnding reports whether local rank's process in g has ended or is
// ending, although its exit may not have been delivered: from g when it
// knows, else from /proc by its pid.
func rankEnding(g RankGroup, localRank int) bool {
	if e, ok := g.(rankEnder); ok {
		return e.Ending(localRank)
	}
	pid, ok := g.PIDs()[localRank]
	return !ok || procfs.Ending(pid)
}

// rankStopped reports a rank whose process is stopped by a signal
// (procfs.Stat.Stopped); false when it cannot be read (it ended: its exit
// tells).
func rankStopped(g RankGroup, localRank int) bool {
	pid, ok := g.PIDs()[localRank]
	if !ok || pid <= 0 {
		return false
	}
	st, err := procfs.Read(pid)
	return err == nil && st.Stopped()
}

// signalRank signals one rank's process group in g.
func signalRank(g RankGroup, localRank int, sig syscall.Signal) error {
	if s, ok := g.(rankSignaler); ok {
		return s.Signal(localRank, sig)
	}
	pid := g.PIDs()[localRank]
	if pid <= 0 {
		return fmt.Errorf("no pid for local rank %d", localRank)
	}
	return syscall.Kill(-pid, sig)
}
