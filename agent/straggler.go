package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/straggler"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// SpeedExchange is the rendezvous's side of the straggler measurement
// (rendezvous.Etcd): every node publishes its ranks' sample each
// interval, the round's group rank 0 judges them all and publishes the
// result, which every node reads.
type SpeedExchange interface {
	PublishSpeed(ctx context.Context, round int, sample []byte) error
	Speeds(ctx context.Context, round int) ([][]byte, error)
	PublishSpeedResult(ctx context.Context, round int, result []byte) error
	SpeedResult(ctx context.Context, round int) ([]byte, error)
}

// computeTimer is the monitors' time of each rank in "compute" sections
// (*monitor.Manager).
type computeTimer interface {
	ComputeTime(localRank int) (time.Duration, bool)
}

// DefaultSpeedInterval is how often each node samples and publishes its
// ranks' speed: 6 writes per node per minute, and a judgement ~3
// intervals after a node slows down (docs/stragglers.md).
const DefaultSpeedInterval = 10 * time.Second

// speedWatch measures this node's ranks' speed during one cycle
// (straggler.go's loop) and tells supervise once when the job-wide
// judgement names this node a straggler.
type speedWatch struct {
	notices chan straggler.NodeSpeed
	cancel  context.CancelFunc
	done    chan struct{}
}

// stop ends the loop and waits for it.
func (w *speedWatch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// notify is supervise's channel (nil when nothing is measured).
func (w *speedWatch) notify() <-chan straggler.NodeSpeed {
	if w == nil {
		return nil
	}
	return w.notices
}

// startSpeedWatch starts the measurement for the running cycle, or
// returns nil when it is off (--ft-straggler off, a single-node job, no
// etcd rendezvous).
func (a *Agent) startSpeedWatch(ctx context.Context, asg rendezvous.Assignment, g RankGroup) *speedWatch {
	ft := a.cfg.FT
	if a.d.Speed == nil || ft.Straggler == configs.StragglerOff || asg.GroupWorldSize < 2 || g == nil {
		return nil
	}
	interval := a.d.SpeedInterval
	if interval <= 0 {
		interval = DefaultSpeedInterval
	}
	demand := a.d.Demand
	if demand == nil {
		demand = procfs.GroupDemand
	}
	cpu := straggler.CPUReader(demand)
	read := cpu
	if ct, ok := a.d.Monitors.(computeTimer); ok {
		// A rank that reports "compute" sections is measured by them:
		// its own work, whatever it spins on while it waits.
		read = func(lr, pg int) (time.Duration, string, bool) {
			if d, seen := ct.ComputeTime(lr); seen {
				return d, "compute", true
			}
			return cpu(lr, pg)
		}
	}
	window := time.Duration(ft.StragglerWindow * float64(time.Second))
	ctx, cancel := context.WithCancel(ctx)
	w := &speedWatch{notices: make(chan straggler.NodeSpeed, 1), cancel: cancel, done: make(chan struct{})}
	l := &speedLoop{a: a, asg: asg, g: g, interval: interval, sampler: straggler.NewSampler(read),
		judge: straggler.NewJudge(straggler.Options{Threshold: ft.StragglerThreshold, Window: window, MaxAge: 3 * interval}),
		own:   straggler.NewSmoother(window), w: w}
	go func() {
		defer close(w.done)
		l.run(ctx)
	}()
	return w
}

type speedLoop struct {
	a        *Agent
	asg      rendezvous.Assignment
	g        RankGroup
	interval time.Duration
	sampler  *straggler.Sampler
	judge    *straggler.Judge    // used on group rank 0 only
	own      *straggler.Smoother // this node's samples of the window
	w        *speedWatch
	notified bool
	warnOnce sync.Once
}

func (l *speedLoop) run(ctx context.Context) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	last := time.Now()
	l.sampler.Sample(last, l.g.PIDs())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.tick(ctx, now, now.Sub(last))
			last = now
		}
	}
}

// tick samples, publishes, judges (on group rank 0) and reads the result.
func (l *speedLoop) tick(ctx context.Context, now time.Time, span time.Duration) {
	a, round := l.a, l.asg.Round
	busy := l.sampler.Sample(now, l.g.PIDs())
	if len(busy) == 0 {
		return
	}
	s := straggler.NodeSample{Node: a.d.NodeID, Host: a.d.Hostname, At: now.UnixMilli(), WindowS: span.Seconds()}
	for lr, b := range busy {
		b.Rank = l.asg.RankBase + lr
		s.Ranks = append(s.Ranks, b)
	}
	b, _ := json.Marshal(s)
	if err := a.d.Speed.PublishSpeed(ctx, round, b); err != nil {
		l.warn("publish this node's speed", err)
		return
	}
	l.own.Add(s)
	var res straggler.Result
	if l.asg.GroupRank == 0 {
		all, err := a.d.Speed.Speeds(ctx, round)
		if err != nil {
			l.warn("read the nodes' speeds", err)
			return
		}
		var samples []straggler.NodeSample
		for _, raw := range all {
			var ns straggler.NodeSample
			if json.Unmarshal(raw, &ns) == nil { // a sample is data; one that does not parse is left out
				samples = append(samples, ns)
			}
		}
		res = l.judge.Judge(now, samples)
		rb, _ := json.Marshal(res.Published())
		if err := a.d.Speed.PublishSpeedResult(ctx, round, rb); err != nil {
			l.warn("publish the speed judgement", err)
		}
	} else {
		rb, err := a.d.Speed.SpeedResult(ctx, round)
		if err != nil || rb == nil || json.Unmarshal(rb, &res) != nil || now.Sub(time.UnixMilli(res.At)) > 3*l.interval {
			res = straggler.Result{Why: "no fresh job-wide judgement"}
		}
	}
	me, ranks, ok := res.For(a.d.NodeID, l.own.At(now))
	if !ok {
		me.Speed = -1
	}
	l.record(s, res.Why, me, ranks)
	if me.Straggler && !l.notified {
		l.notified = true
		l.w.notices <- me
	}
}

// record is the interval's event and metrics for this node's ranks:
// each rank's busy share over the interval, and its speed over the
// window (-1: not judged).
func (l *speedLoop) record(s straggler.NodeSample, why string, me straggler.NodeSpeed, ranks map[int]float64) {
	ev := eventlog.RankSpeedEvent{Round: l.asg.Round, WindowS: s.WindowS, NodeSpeed: me.Speed, SlowForS: me.SlowForS, Why: why}
	for _, r := range s.Ranks {
		sp, ok := ranks[r.Rank]
		if !ok {
			sp = -1
		}
		ev.Ranks = append(ev.Ranks, eventlog.RankSpeedEntry{Rank: r.Rank, LocalRank: r.LocalRank, Busy: r.Busy, Speed: sp, Source: r.Source})
		l.a.d.Metrics.RankSpeed(r.Rank, r.LocalRank, r.Busy, sp)
	}
	if me.Speed >= 0 {
		l.a.d.Metrics.NodeSpeed(me.Speed)
	}
	l.a.ev.Emit(ev)
}

func (l *speedLoop) warn(what string, err error) {
	l.warnOnce.Do(func() {
		l.a.log.Warn("straggler measurement: could not "+what+"; trying again each interval (logged once per cycle)", "err", err)
	})
}

// stragglerPoll is how often a pending swap checks for the ranks' next
// state save.
const stragglerPoll = 100 * time.Millisecond

// stragglerPending is a swap decided for this node, waiting for the next
// state save.
type stragglerPending struct {
	me    straggler.NodeSpeed
	since time.Time
	ckpt  int64 // the ranks' checkpoints when it was decided
}

// checkpoints counts the state saves the ranks completed so far (-1:
// unknown).
func (a *Agent) checkpoints() int64 {
	if p, ok := a.d.Monitors.(progressReporter); ok {
		if pr := p.Progress(); pr != nil {
			return pr.Checkpoints
		}
	}
	return -1
}

// onStraggler handles the judgement that names this node a straggler:
// with --ft-straggler swap and a spare standing by, a swap waits for the
// next state save (returned); otherwise it is reported, never killed.
func (a *Agent) onStraggler(me straggler.NodeSpeed) *stragglerPending {
	asg, mode := a.run.asg, a.cfg.FT.Straggler
	ev := eventlog.StragglerEvent{Round: asg.Round, Speed: me.Speed, SlowForS: me.SlowForS, Mode: mode}
	switch {
	case mode != configs.StragglerSwap:
		ev.Action, ev.Why = "reported", "--ft-straggler "+mode
	case asg.Standbys == 0:
		ev.Action, ev.Why = "kept", "no spare stood by in the round: a straggler is reported, never killed"
	case a.hostsJobEtcd():
		ev.Action, ev.Why = "kept", hostsEtcdWhy
	default:
		ev.Action = "swapping"
	}
	a.log.Warn("this node is a straggler", "speed", me.Speed, "slow_for_s", me.SlowForS, "mode", mode, "action", ev.Action, "why", ev.Why)
	a.ev.Emit(ev)
	a.d.Metrics.Straggler(ev.Action)
	if ev.Action != "swapping" {
		return nil
	}
	return &stragglerPending{me: me, since: time.Now(), ckpt: a.checkpoints()}
}

// stragglerDue reports whether a pending swap goes now: the ranks saved
// their state since it was decided, or they did not within the straggler
// window (a job that never saves would keep its straggler for ever; the
// in-process restart then loses only the step in flight).
func (a *Agent) stragglerDue(p *stragglerPending) (string, bool) {
	if c := a.checkpoints(); c >= 0 && p.ckpt >= 0 && c > p.ckpt {
		return "after the ranks' state save", true
	}
	if wait := time.Duration(a.cfg.FT.StragglerWindow * float64(time.Second)); time.Since(p.since) >= wait {
		return "no state save within " + wait.String(), true
	}
	return "", false
}

// swapOutStraggler: this node leaves the job for the spare that stood by
// (a planned swap: no failure is reported, no restart spent); it is
// quarantined for the job with evidence straggler.
func (a *Agent) swapOutStraggler(ctx context.Context, end cycleEnd) State {
	asg := a.run.asg
	reason := "quarantined: " + end.reason
	a.log.Warn("straggler: leaving the job for a spare", "reason", end.reason)
	if _, err := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error { return a.d.Rdzv.Leave(ctx, reason) }); err != nil {
		a.log.Warn("leaving the rendezvous", "err", err)
	}
	a.ev.Emit(eventlog.StragglerEvent{Round: asg.Round, Speed: end.straggler.Speed, SlowForS: end.straggler.SlowForS,
		Mode: a.cfg.FT.Straggler, Action: "swapped", Why: end.reason})
	a.d.Metrics.Straggler("swapped")
	a.run.quarantine(a.d.NodeID, a.d.Hostname, verdict.EvidenceStraggler, end.reason, asg.Round)
	a.run.setOutcome(verdict.NodeExcluded, reason)
	return StateDone
}

// stragglerReason is the cycle's reason for a straggler swap.
func stragglerReason(me straggler.NodeSpeed, when string, threshold float64) string {
	return fmt.Sprintf("straggler: this node's ranks worked at %s of the other nodes' pace for %.0f s (threshold %s); swapped for a spare %s",
		strconv.FormatFloat(me.Speed, 'f', 2, 64), me.SlowForS, strconv.FormatFloat(1-threshold, 'f', 2, 64), when)
}
