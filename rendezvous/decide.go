package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/ledger/etcdstore"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// NoRestartExitCode is the exit code of a job closed because a rank asked
// not to be restarted, when the close came through Fail(NoRestartRequest)
// rather than Shutdown with the agent's configured code (nvrx's default).
const NoRestartExitCode = verdict.DefaultNoRestartExitCode

// roundFacts are the job-wide facts the restart policy needs about round
// r, read at one revision.
type roundFacts struct {
	round       int        // ctl/round; -1 when absent
	closed      *closeInfo // the job's close record, if any
	restarts    int        // ctl/restarts: restarts spent so far
	restartsRev int64      // mod revision of ctl/restarts (0: absent); fences the end txn
	cfg         jobConfig  // the job's agreed budget (its stored config)
	// recent are the times of the job's counted restarts still in its
	// restart window (ctl/restart-times; none without a window).
	recent   []time.Time
	spares   int // live nodes of the job that are not active in r
	present  int // live nodes of the job (active and spare), lost node excluded
	excluded *excludeInfo
	// ledger is the lost node's leases in the job's ledger; ledgerRead
	// says they were read (a node loss, round r still open).
	ledger     []*mvccpb.KeyValue
	ledgerRead bool
}

// endRound is the single fenced txn that ends round r. It applies the
// restart policy (policy.Decide) to failure f with the job's restart count
// from etcd: open round r+1 (restart in place, spending a restart, or swap
// in a spare, spending none) or close the job with the policy's kind. lost
// names the lost node for a node loss ("" for a local failure); a node
// that left on purpose (excluded record) turns the loss into NodeExcluded,
// one stopped by a signal (Depart) into NodeStopped.
// evidence is when the failure was first seen (zero: not known), for the
// end record's detection time. extra are the caller's fences. A report that lost a race, or was fenced
// out, returns what the job did instead.
func (rd *round) endRound(ctx context.Context, f policy.Failure, lost, reason string, evidence time.Time, extra []clientv3.Cmp) (Decision, error) {
	facts, err := rd.readFacts(ctx, lost)
	if err != nil {
		return Decision{}, fmt.Errorf("rendezvous: end round %d: read job state: %w", rd.r, err)
	}
	if facts.excluded != nil {
		f, reason = facts.excluded.failure(lost)
	}
	in := policy.Input{Failure: f, RestartsUsed: facts.restarts, MaxRestarts: facts.cfg.MaxRestarts,
		SparesAvailable: facts.spares, NodesPresent: facts.present, MinNodes: rd.o.MinNodes,
		Window: facts.cfg.window(), RecentRestarts: facts.recent, Now: time.Now(), Delay: facts.cfg.delay()}
	if lost == "" {
		// A rank failure leaves the membership as it is; it never takes a spare.
		in.SparesAvailable, in.NodesPresent = 0, rd.o.MinNodes
	}
	subject := rd.o.NodeID // the node that caused the end: the reporter, or the node it lost
	if lost != "" {
		subject = lost
	}
	// A lost node's open ledger leases are ended in this same txn: one
	// writer for the whole job, exactly once (the txn that ends the round
	// is unique), where every survivor used to read and race to write them.
	lreason, ledgerBy := ledgerReason(f), ""
	if facts.ledgerRead && lreason != "" {
		ledgerBy = rd.o.NodeID
	}
	ops, dec := rd.endOps(f, in, policy.Decide(in), facts.restarts, subject, reason, evidence, ledgerBy)
	if ledgerBy != "" {
		var recs []ledger.Record
		for _, c := range etcdstore.CloseOps(facts.ledger, lreason, dec.Reason, rd.o.NodeID, time.Now().UTC()) {
			ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{c.Cmp}, []clientv3.Op{c.Put}, nil))
			recs = append(recs, c.Record)
		}
		// Kept before the commit: the ctl watch may deliver the end first.
		rd.stashLedger(subject, recs)
	}
	conds := append([]clientv3.Cmp{
		clientv3.Compare(clientv3.Value(rd.k.round()), "=", strconv.Itoa(rd.r)),
		clientv3.Compare(clientv3.CreateRevision(rd.k.closed()), "=", 0),
		clientv3.Compare(clientv3.ModRevision(rd.k.restarts()), "=", facts.restartsRev),
		rd.genCmp,
	}, extra...)
	resp, err := rd.cli.Txn(ctx).If(conds...).Then(ops...).
		Else(clientv3.OpGet(rd.k.round()), clientv3.OpGet(rd.k.closed()), clientv3.OpGet(rd.k.restarts()), clientv3.OpGet(rd.k.lastEnd())).Commit()
	if ledgerBy != "" && (err != nil || !resp.Succeeded) {
		rd.stashLedger(subject, nil)
	}
	if err != nil {
		return Decision{}, fmt.Errorf("rendezvous: end round %d: %w", rd.r, err)
	}
	if resp.Succeeded {
		rd.log.Info("rendezvous round ended", "round", rd.r, "failure", string(f), "action", string(dec.Action),
			"restarts_used", dec.RestartsUsed, "reason", dec.Reason)
		dec.Ended = true
		return dec, nil
	}
	return rd.raceOutcome(resp)
}

// ledgerReason is the ledger's reason for a node's leases ended by
// failure f ("" for a failure that is not a node's loss or departure).
func ledgerReason(f policy.Failure) ledger.Reason {
	switch f {
	case policy.NodeLost:
		return ledger.NodeFailure
	case policy.NodeExcluded:
		return ledger.Excluded
	case policy.NodeStopped:
		return ledger.Stopped
	}
	return ""
}

// stashLedger keeps (recs != nil) or drops the ledger records this node's
// end txn of round r writes for subject.
func (rd *round) stashLedger(subject string, recs []ledger.Record) {
	rd.view.stashLedger(rd.r, subject, recs)
}

// endOps are the writes that carry out policy decision d, taken on in, for
// round r; ledgerBy names this node when the txn also ends subject's
// ledger leases.
func (rd *round) endOps(f policy.Failure, in policy.Input, d policy.Decision, used int, subject, reason string, evidence time.Time, ledgerBy string) ([]clientv3.Op, Decision) {
	if d.Action == policy.CloseJob {
		code := verdict.CloseExitCode(d.Close)
		ci := closeInfo{Kind: d.Close, Code: code, Reason: d.Why + ": " + reason, Node: subject, Cause: f, LedgerBy: ledgerBy}
		cb, _ := json.Marshal(ci)
		return []clientv3.Op{clientv3.OpPut(rd.k.closed(), string(cb))},
			Decision{Action: d.Action, Close: d.Close, Code: code, Reason: ci.Reason, RestartsUsed: used}
	}
	if d.CountsRestart {
		used++
	}
	le := endInfo{Round: rd.r, Reason: reason + "; " + d.Why, Node: subject, Cause: f, Action: d.Action, RestartsUsed: used,
		At: time.Now().UTC(), LedgerBy: ledgerBy, DelayMS: float64(d.Delay.Microseconds()) / 1000}
	if !evidence.IsZero() {
		le.DetectMS = float64(le.At.Sub(evidence).Microseconds()) / 1000
	}
	lb, _ := json.Marshal(le)
	ops := []clientv3.Op{clientv3.OpPut(rd.k.lastEnd(), string(lb)), clientv3.OpPut(rd.k.round(), strconv.Itoa(rd.r+1)),
		clientv3.OpPut(rd.k.restarts(), strconv.Itoa(used))}
	if d.CountsRestart && in.Window > 0 {
		// Written with ctl/restarts, whose revision fences every end txn:
		// the times cannot change under a decision taken on them.
		tb, _ := json.Marshal(in.Budget().Recent(append(in.RecentRestarts, in.Now.UTC()), in.Now))
		ops = append(ops, clientv3.OpPut(rd.k.restartTimes(), string(tb)))
	}
	if subject != rd.o.NodeID {
		// The next round's closer must not wait for the node that ended
		// this one: its death is recorded with the end, not after it.
		ops = append(ops, clientv3.OpPut(rd.k.dead(subject), rd.o.NodeID, clientv3.WithLease(rd.sess.current())))
		if quarantines(f, d.Action, subject) {
			ops = append(ops, rd.quarantineOp(f, subject, reason))
		}
	}
	return ops, Decision{Restart: true, Action: d.Action, Reason: le.Reason, RestartsUsed: used, Delay: d.Delay}
}

// raceOutcome reads the else branch of the end txn (round, close record,
// restarts, last end) and reports what the job did instead.
func (rd *round) raceOutcome(resp *clientv3.TxnResponse) (Decision, error) {
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	used := 0
	if kv := kvs(2); len(kv) > 0 {
		used, _ = strconv.Atoi(string(kv[0].Value))
	}
	if kv := kvs(1); len(kv) > 0 {
		ci := decodeClose(kv[0].Value)
		return Decision{Action: policy.CloseJob, Close: ci.Kind, Code: ci.Code, Reason: ci.Reason, RestartsUsed: used}, nil
	}
	cur := -1
	if kv := kvs(0); len(kv) > 0 {
		cur, _ = strconv.Atoi(string(kv[0].Value))
	}
	if cur < rd.r {
		return Decision{}, fmt.Errorf("rendezvous: round %d reported but the job is at round %d", rd.r, cur)
	}
	if cur == rd.r {
		return Decision{Restart: true, Action: policy.RestartInPlace, RestartsUsed: used,
			Reason: fmt.Sprintf("node %s no longer belongs to round %d (membership expired)", rd.o.NodeID, rd.r)}, nil
	}
	d := Decision{Restart: true, Action: policy.RestartInPlace, RestartsUsed: used,
		Reason: fmt.Sprintf("round %d already superseded by round %d", rd.r, cur)}
	var le endInfo
	if kv := kvs(3); len(kv) > 0 && json.Unmarshal(kv[0].Value, &le) == nil && le.Round == rd.r && le.Action != "" {
		d.Action, d.Reason = le.Action, fmt.Sprintf("%s (round %d already ended: %s)", d.Reason, rd.r, le.Reason)
	}
	return d, nil
}

// readFacts reads what the policy needs about round r in one txn. For a
// node loss (lost != "") it also reads round r's ranks, the memberships of
// rounds r and r+1 (a standby registers for the next round at once) and
// the lost node's excluded record.
func (rd *round) readFacts(ctx context.Context, lost string) (roundFacts, error) {
	ops := []clientv3.Op{clientv3.OpGet(rd.k.round()), clientv3.OpGet(rd.k.closed()),
		clientv3.OpGet(rd.k.restarts()), clientv3.OpGet(rd.k.config()), clientv3.OpGet(rd.k.restartTimes())}
	const always = 5 // the reads above, made in both branches
	if lost != "" {
		ops = append(ops, clientv3.OpGet(rd.k.ranks(rd.r), clientv3.WithPrefix()),
			clientv3.OpGet(rd.k.nodes(rd.r), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(rd.k.nodes(rd.r+1), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(rd.k.excluded(lost)),
			clientv3.OpGet(etcdstore.NodePrefix(etcdstore.LedgerBase(rd.k.base), lost), clientv3.WithPrefix()))
	}
	// The loss reads are O(nodes) and several survivors may report the
	// same loss: only while round r is open and the job not closed, so a
	// late reporter reads O(1) (its end txn then loses the race anyway).
	resp, err := rd.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(rd.k.round()), "=", strconv.Itoa(rd.r)),
		clientv3.Compare(clientv3.CreateRevision(rd.k.closed()), "=", 0)).
		Then(ops...).Else(ops[:always]...).Commit()
	if err != nil {
		return roundFacts{}, err
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	f := roundFacts{round: -1, cfg: rd.node.jobConfig()}
	if kv := kvs(0); len(kv) > 0 {
		f.round, _ = strconv.Atoi(string(kv[0].Value))
	}
	if kv := kvs(1); len(kv) > 0 {
		ci := decodeClose(kv[0].Value)
		f.closed = &ci
	}
	if kv := kvs(2); len(kv) > 0 {
		f.restarts, _ = strconv.Atoi(string(kv[0].Value))
		f.restartsRev = kv[0].ModRevision
	}
	var cfg jobConfig
	if kv := kvs(3); len(kv) > 0 && json.Unmarshal(kv[0].Value, &cfg) == nil {
		f.cfg = cfg
	}
	if kv := kvs(4); len(kv) > 0 && f.cfg.window() > 0 {
		_ = json.Unmarshal(kv[0].Value, &f.recent) // unreadable: no recent restart counts (logged by nobody: written only here)
	}
	if lost != "" && resp.Succeeded {
		f.countNodes(rd.k, rd.r, lost, kvs(5), kvs(6), kvs(7))
		var x excludeInfo
		if kv := kvs(8); len(kv) > 0 && json.Unmarshal(kv[0].Value, &x) == nil {
			f.excluded = &x
		}
		f.ledger, f.ledgerRead = kvs(9), true
	}
	return f, nil
}

// countNodes counts the live nodes after losing node lost: a node is live
// while one of its memberships (round r or r+1) exists, i.e. its lease is
// alive; a live node that is not active in round r is a spare.
func (f *roundFacts) countNodes(k keys, r int, lost string, ranks, now, next []*mvccpb.KeyValue) {
	active := map[string]bool{}
	for _, kv := range ranks {
		var ri rankInfo
		if json.Unmarshal(kv.Value, &ri) == nil && !ri.Standby {
			active[strings.TrimPrefix(string(kv.Key), k.ranks(r))] = true
		}
	}
	alive := map[string]bool{}
	for _, kv := range now {
		alive[strings.TrimPrefix(string(kv.Key), k.nodes(r))] = true
	}
	for _, kv := range next {
		alive[strings.TrimPrefix(string(kv.Key), k.nodes(r+1))] = true
	}
	delete(alive, lost)
	for id := range alive {
		if !active[id] {
			f.spares++
		}
	}
	f.present = len(alive)
}

// jobConfig is the job's configuration as this node knows it (the stored
// job config once checked, else its own options).
func (e *Etcd) jobConfig() jobConfig {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg != nil {
		return *e.cfg
	}
	return e.o.jobConfig()
}

// jobConfig is the job configuration these options propose.
func (o EtcdOptions) jobConfig() jobConfig {
	return jobConfig{NProcPerNode: o.NProcPerNode, MinNodes: o.MinNodes, MaxNodes: o.MaxNodes, MaxRestarts: o.MaxRestarts,
		RestartWindowS: o.RestartWindow.Seconds(), RestartDelayS: o.RestartDelay.Seconds(), Layout: keyLayout}
}

// readRestarts returns the job's restart count (ctl/restarts).
func (rd *round) readRestarts(ctx context.Context) (int, error) {
	resp, err := rd.cli.Get(ctx, rd.k.restarts())
	if err != nil {
		return 0, fmt.Errorf("read restart count: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		return 0, fmt.Errorf("bad restart count %q: %w", resp.Kvs[0].Value, err)
	}
	return n, nil
}

// decodeClose reads a close record; one without a kind (older launchers)
// is read as success for code 0 and as a fatal error otherwise.
func decodeClose(b []byte) closeInfo {
	var ci closeInfo
	if err := json.Unmarshal(b, &ci); err != nil {
		return closeInfo{Kind: verdict.FatalError, Code: 1, Reason: "unreadable close record: " + string(b)}
	}
	if ci.Kind == "" {
		ci.Kind = verdict.FatalError
		if ci.Code == 0 {
			ci.Kind = verdict.Succeeded
		}
	}
	return ci
}
