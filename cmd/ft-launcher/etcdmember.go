package main

// The keeper of the embedded etcd member this launcher hosts. The member
// (ft-launcher-etcd) is a child of the launcher, so its death is reported
// by the reaper at once; the keeper logs it, writes an event, counts it in
// the metrics and the verdict, and restarts the member:
//
//   - on its intact data dir (the dir the dead server reported, adopted by
//     the new one): the member keeps its id and simply rejoins its cluster,
//     catching up from its peers;
//   - else, in a cluster, as a new member: removed (MemberRemove) and added
//     again on the same peer URL (MemberAdd) through the surviving members,
//     then started on a fresh data dir with initial-cluster-state=existing;
//   - a single member whose data is gone is not restarted: an empty store
//     would not hold the job's rendezvous, and the job ends on the etcd
//     loss bound as it does today.
//
// Restarts are bounded (policy.RestartBudget): the first is immediate, a member
// that dies again soon waits longer each time, and after a limit within a
// window the keeper gives up and says so. Nothing is restarted once the
// launcher shuts down.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// defaultRestartPolicy: one death is repaired at once; a crash loop waits
// 1 s, 2 s, 4 s... (at most 30 s) between attempts and stops after 5
// attempts within 10 minutes; a member that served a minute starts the
// backoff over (docs/rendezvous.md, "A dead member").
var defaultRestartPolicy = policy.RestartBudget{Limit: 5, Window: 10 * time.Minute,
	Backoff: time.Second, MaxBackoff: 30 * time.Second, Stable: time.Minute}

// memberFailures collects the verdict's etcd_member_failures; safe for
// concurrent use and on nil.
type memberFailures struct {
	mu   sync.Mutex
	list []verdict.EtcdMemberFailure
}

// maxMemberFailures bounds the list: the newest are kept.
const maxMemberFailures = 32

func (f *memberFailures) add(e verdict.EtcdMemberFailure) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, e)
	if len(f.list) > maxMemberFailures {
		f.list = f.list[len(f.list)-maxMemberFailures:]
	}
}

func (f *memberFailures) snapshot() []verdict.EtcdMemberFailure {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]verdict.EtcdMemberFailure(nil), f.list...)
}

// keeperDeps is where the keeper reports, and the cluster it repairs.
type keeperDeps struct {
	events   *eventlog.Log
	metrics  *metrics.Metrics
	failures *memberFailures
	// peers are every member's client URL (this member's included): the
	// member API is asked through the others.
	peers  []string
	policy policy.RestartBudget
}

// memberKeeper watches and restarts one hosted member.
type memberKeeper struct {
	ctx    context.Context
	cancel context.CancelFunc
	reaper *spawn.Reaper
	log    *slog.Logger
	bin    string
	m      member
	deps   keeperDeps
	budget policy.RestartTracker
	done   chan struct{}
	peers  chan struct{} // closed when watchPeers ended

	mu  sync.Mutex
	cur *companion // the running server; nil once given up
}

func newMemberKeeper(ctx context.Context, reaper *spawn.Reaper, log *slog.Logger, bin string, m member, c *companion, deps keeperDeps) *memberKeeper {
	if deps.policy == (policy.RestartBudget{}) {
		deps.policy = defaultRestartPolicy
	}
	// Its own life: the set-up context may end with the set-up; stop ends it.
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k := &memberKeeper{ctx: kctx, cancel: cancel, reaper: reaper, log: log.With("member", m.name), bin: bin, m: m,
		deps: deps, budget: policy.RestartTracker{Budget: deps.policy}, cur: c, done: make(chan struct{}), peers: make(chan struct{})}
	deps.metrics.EtcdMemberUp(m.name)
	go k.run()
	if m.cluster != "" {
		go k.watchPeers(peerCheckInterval)
	} else {
		close(k.peers)
	}
	return k
}

// stop ends the keeper (no restart after this), then stops the server.
func (k *memberKeeper) stop() {
	k.cancel()
	<-k.done
	<-k.peers
	k.mu.Lock()
	c := k.cur
	k.cur = nil
	k.mu.Unlock()
	if c != nil {
		c.stop()
	}
}

func (k *memberKeeper) run() {
	defer close(k.done)
	for {
		k.mu.Lock()
		c := k.cur
		k.mu.Unlock()
		var e spawn.Exit
		select {
		case e = <-c.g.Exits():
		case <-k.ctx.Done():
			return
		}
		if k.ctx.Err() != nil {
			return // the launcher stops it: no death
		}
		c.out.Close()
		if !k.repair(c, e) {
			return
		}
	}
}

// exitStatus says how a process ended: "killed by SIGKILL", "exit code 1".
func exitStatus(e spawn.Exit) string {
	if e.Signal != 0 {
		return "killed by " + unix.SignalName(e.Signal)
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

// repair reports the death of c and restarts the member; false when it
// gave up or the launcher shuts down (the member stays dead).
func (k *memberKeeper) repair(c *companion, e spawn.Exit) bool {
	status := exitStatus(e)
	up := time.Since(c.started)
	// ft-launcher-etcd exits 0 only when stopped by SIGTERM or SIGINT:
	// sent from outside (a scheduler stopping every process of the job
	// step or container), so the node is going away: no restart.
	deliberate := !e.Failed()
	msg := "embedded etcd member exited; restarting it"
	if deliberate {
		msg = "embedded etcd member stopped by a signal from outside the launcher (exit code 0); not restarting it"
	}
	k.log.Error(msg, "pid", e.PID, "exit", status,
		"exit_code", e.Code, "signal", unix.SignalName(e.Signal), "served_for", up.Round(time.Millisecond))
	k.deps.events.Emit(eventlog.EtcdMemberExitedEvent{Member: k.m.name, PID: e.PID, Exit: status,
		ExitCode: e.Code, Signal: unix.SignalName(e.Signal), ServedS: up.Seconds(), Restart: !deliberate})
	k.deps.metrics.EtcdMemberExited(k.m.name)
	f := verdict.EtcdMemberFailure{Member: k.m.name, PID: e.PID, Exit: status, At: e.At.UTC()}
	if deliberate {
		f.Action = verdict.EtcdMemberNotRestarted
		k.deps.failures.add(f)
		k.mu.Lock()
		k.cur = nil
		k.mu.Unlock()
		return false
	}

	served, adopt := c.started, c.dir
	for {
		wait, ok := k.budget.Next(time.Now(), served)
		if !ok {
			return k.giveUp(f, fmt.Sprintf("%d restart attempts within %v spent", k.deps.policy.Limit, k.deps.policy.Window))
		}
		if wait > 0 {
			k.log.Warn("embedded etcd member: waiting before the next restart attempt", "wait", wait)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-k.ctx.Done():
				t.Stop()
			}
		}
		if k.ctx.Err() != nil {
			f.Action = verdict.EtcdMemberNotRestarted
			k.deps.failures.add(f)
			return false
		}
		f.Attempts++
		nc, how, err := k.restart(adopt)
		if err == nil {
			took := time.Since(e.At)
			k.mu.Lock()
			stopping := k.ctx.Err() != nil
			if !stopping {
				k.cur = nc
			}
			k.mu.Unlock()
			if stopping { // the launcher stopped while it started
				nc.stop()
				f.Action = verdict.EtcdMemberNotRestarted
				k.deps.failures.add(f)
				return false
			}
			at := nc.started.UTC()
			f.Action, f.RestartedAt, f.Error = how, &at, ""
			k.deps.failures.add(f)
			k.log.Info("embedded etcd member restarted and serving", "how", how, "pid", nc.pid,
				"attempts", f.Attempts, "took", took.Round(time.Millisecond))
			k.deps.events.Emit(eventlog.EtcdMemberRestartedEvent{Member: k.m.name, PID: nc.pid, How: how,
				Attempts: f.Attempts, TookS: took.Seconds(), DeadPID: e.PID})
			k.deps.metrics.EtcdMemberRestarted(k.m.name, string(how))
			return true
		}
		if k.ctx.Err() != nil {
			f.Action = verdict.EtcdMemberNotRestarted
			k.deps.failures.add(f)
			return false
		}
		f.Error = err.Error()
		var perm permanentError
		if errors.As(err, &perm) {
			return k.giveUp(f, err.Error())
		}
		k.log.Warn("embedded etcd member: restart attempt failed", "attempt", f.Attempts, "err", err)
		served, adopt = time.Time{}, "" // a failed start leaves no data to adopt
	}
}

// giveUp records that the member stays dead.
func (k *memberKeeper) giveUp(f verdict.EtcdMemberFailure, why string) bool {
	f.Action = verdict.EtcdMemberGaveUp
	if f.Error == "" {
		f.Error = why
	}
	k.deps.failures.add(f)
	k.mu.Lock()
	k.cur = nil
	k.mu.Unlock()
	k.log.Error("embedded etcd member not restarted: the cluster runs without it", "why", why, "attempts", f.Attempts)
	k.deps.events.Emit(eventlog.EtcdMemberGaveUpEvent{Member: k.m.name, Why: why, Attempts: f.Attempts})
	return false
}

// permanentError is a restart that no retry can make work.
type permanentError struct{ error }

// restartReady bounds a restarted member's start: it serves once it has
// caught up with its peers (seconds), or never without a quorum.
const restartReady = 55 * time.Second

// restart starts the member again: on adopt (its intact data dir) if
// given, else (or if that fails) as a new member of the cluster.
func (k *memberKeeper) restart(adopt string) (*companion, verdict.EtcdMemberAction, error) {
	if adopt != "" {
		argv := append(k.m.args(k.bin), "--adopt-dir", adopt)
		c, err := startCompanion(k.ctx, k.reaper, argv, restartReady)
		if err == nil {
			return c, verdict.EtcdMemberRejoined, nil
		}
		if k.ctx.Err() != nil {
			return nil, "", err
		}
		k.log.Warn("embedded etcd member: could not restart it on its data dir; replacing it with a new member", "dir", adopt, "err", err)
	}
	if k.m.cluster == "" {
		return nil, "", permanentError{errors.New("the single-member etcd lost its data dir: a new, empty one would not hold the job's rendezvous")}
	}
	cluster, err := k.readd()
	if err != nil {
		return nil, "", err
	}
	argv := []string{k.bin, "--client-url", k.m.clientURL, "--peer-url", k.m.peerURL, "--name", k.m.name,
		"--initial-cluster", cluster, "--cluster-token", k.m.token, "--initial-cluster-state", "existing",
		"--ready-timeout", restartReady.String()}
	c, err := startCompanion(k.ctx, k.reaper, argv, restartReady+5*time.Second)
	if err != nil {
		return nil, "", fmt.Errorf("start the re-added member: %w", err)
	}
	return c, verdict.EtcdMemberReplaced, nil
}

// memberAPITimeout bounds the member API calls of one replacement: etcd
// refuses a reconfiguration until the members it keeps have been connected
// for its health interval (5 s), e.g. in a cluster that just started.
const memberAPITimeout = 20 * time.Second

// whileSettling calls f until it succeeds, fails otherwise than with etcd's
// "unhealthy cluster" or "not enough started members" (its members have
// not been connected long enough for a reconfiguration), or ctx ends.
func whileSettling(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil || !(errors.Is(err, rpctypes.ErrUnhealthy) || errors.Is(err, rpctypes.ErrMemberNotEnoughStarted)) {
			return err
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%w (etcd: %w)", ctx.Err(), err)
		}
	}
}

// readd removes this member from the cluster (by its peer URL: a member
// re-added earlier has a new id) and adds it again, through the other
// members, and returns the initial cluster (name=peerURL,...) the new
// member starts with.
func (k *memberKeeper) readd() (string, error) {
	var others []string
	for _, p := range k.deps.peers {
		if p != k.m.clientURL {
			others = append(others, p)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: others, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), Context: k.ctx})
	if err != nil {
		return "", fmt.Errorf("replace the member: connect to %v: %w", others, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(k.ctx, memberAPITimeout)
	defer cancel()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return "", fmt.Errorf("replace the member: member list: %w", err)
	}
	for _, mm := range list.Members {
		for _, u := range mm.PeerURLs {
			if u == k.m.peerURL {
				if err := whileSettling(ctx, func() error { _, err := cli.MemberRemove(ctx, mm.ID); return err }); err != nil {
					return "", fmt.Errorf("replace the member: remove member %x (%s): %w", mm.ID, u, err)
				}
				k.log.Info("embedded etcd member removed from the cluster", "id", fmt.Sprintf("%x", mm.ID))
			}
		}
	}
	var added *clientv3.MemberAddResponse
	err = whileSettling(ctx, func() (err error) { added, err = cli.MemberAdd(ctx, []string{k.m.peerURL}); return err })
	if err != nil {
		return "", fmt.Errorf("replace the member: add %s: %w", k.m.peerURL, err)
	}
	k.log.Info("embedded etcd member added to the cluster again", "id", fmt.Sprintf("%x", added.Member.ID))
	var cluster string
	for _, mm := range added.Members {
		name := mm.Name
		if mm.ID == added.Member.ID {
			name = k.m.name
		} else if name == "" { // a member added but not started yet
			name = fmt.Sprintf("unstarted-%x", mm.ID)
		}
		for _, u := range mm.PeerURLs {
			if cluster != "" {
				cluster += ","
			}
			cluster += name + "=" + u
		}
	}
	return cluster, nil
}

// A hosting launcher checks the other members every peerCheckInterval and
// reports one after peerDownChecks failed checks in a row: a peer's dead
// member shows in this launcher's log within about 2 intervals plus the
// timeouts, and neither a member restarted by its host within seconds nor
// the members stopping one after the other at the job's end is reported.
const (
	peerCheckInterval = 5 * time.Second
	peerCheckTimeout  = 3 * time.Second
	peerDownChecks    = 2
)

// watchPeers checks the other members of the cluster every interval (the
// member list, then each member's status at its own client URL) and logs
// and writes an event when one stops answering and when it answers again:
// a member lost on another node shows here too. This member's own death
// is the reaper's to report; a member list that cannot be read (no quorum)
// is the rendezvous's etcd loss to report.
func (k *memberKeeper) watchPeers(interval time.Duration) {
	defer close(k.peers)
	cli, err := clientv3.New(clientv3.Config{Endpoints: k.deps.peers, DialTimeout: peerCheckTimeout,
		Logger: zap.NewNop(), Context: k.ctx})
	if err != nil {
		k.log.Warn("embedded etcd: cannot watch the other members", "err", err)
		return
	}
	defer cli.Close()
	down := map[uint64]int{} // consecutive failed checks per member id
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-k.ctx.Done():
			return
		}
		ctx, cancel := context.WithTimeout(k.ctx, peerCheckTimeout)
		list, err := cli.MemberList(ctx)
		cancel()
		if err != nil {
			continue
		}
		for _, mm := range list.Members {
			if mm.Name == k.m.name || len(mm.ClientURLs) == 0 {
				continue // this member, or one not started yet
			}
			ctx, cancel := context.WithTimeout(k.ctx, peerCheckTimeout)
			_, err := cli.Status(ctx, mm.ClientURLs[0])
			cancel()
			if k.ctx.Err() != nil {
				return
			}
			switch {
			case err != nil:
				if down[mm.ID]++; down[mm.ID] != peerDownChecks {
					continue
				}
				k.log.Warn("another member of the embedded etcd does not answer: the cluster has less redundancy",
					"peer", mm.Name, "endpoint", mm.ClientURLs[0], "err", err)
				k.deps.events.Emit(eventlog.EtcdPeerMemberDownEvent{Peer: mm.Name, Endpoint: mm.ClientURLs[0], Err: err.Error()})
			case down[mm.ID] >= peerDownChecks:
				delete(down, mm.ID)
				k.log.Info("another member of the embedded etcd answers again", "peer", mm.Name, "endpoint", mm.ClientURLs[0])
				k.deps.events.Emit(eventlog.EtcdPeerMemberUpEvent{Peer: mm.Name, Endpoint: mm.ClientURLs[0]})
			default:
				delete(down, mm.ID)
			}
		}
	}
}
