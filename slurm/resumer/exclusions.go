package resumer

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// pushExclusions gives the pending successor(s) the exclusions known now:
// slurmctld applies ExcNodeList when it places the job, which is after job
// ends (afternotok), so it is in time whenever this runs in job's end step.
// Judged later (the end step did not run), the successor may have started
// already: its begin step then checks its nodes (and relocates it).
func (r *Resumer) pushExclusions(ctx context.Context, st *State, job *ChainJob) {
	excl := st.ActiveExclusions(r.now())
	for _, p := range st.Jobs {
		if p == job || p.Outcome != "" || !p.Began.IsZero() || slices.Equal(p.Exclude, excl) {
			continue
		}
		if err := r.Sched.SetExclude(ctx, p.ID, excl); err != nil {
			if rec, jerr := r.Sched.Job(ctx, p.ID); jerr == nil && rec.State != "PENDING" {
				r.logf("job %s already left the queue (%s) before %s could be excluded from it; its begin step checks its nodes and moves it if it landed on one", p.ID, rec.State, strings.Join(excl, ","))
			} else {
				r.logf("job %s: could not set ExcNodeList=%s: %v (its begin step checks its nodes and moves it if it landed on one)", p.ID, strings.Join(excl, ","), err)
			}
			continue
		}
		p.Exclude = excl
		r.logf("job %s: excluding %s", p.ID, strings.Join(excl, ","))
	}
}

// exclusionCand is a node some evidence says to exclude, named by any of
// keys (a Slurm node name, a host name, an address).
type exclusionCand struct {
	name                   string // the Slurm node name, when already known
	keys                   []string
	host, evidence, detail string
	at                     time.Time
}

// addExclusions records the nodes quarantined in job's verdicts (and the
// node of a verdict of kind node_excluded, one whose ranks kept failing in
// ways that point at it: failing_node, and one whose ranks failed so in
// NodeFailureJobs of the latest NodeFailureJobWindow jobs it ran) as
// exclusions with an expiry.
func (r *Resumer) addExclusions(ctx context.Context, st *State, job *ChainJob, _ []verdict.Verdict) {
	nvs := readVerdicts(filepath.Join(st.Dir, JobsDir, job.ID))
	var cands []exclusionCand
	evidenceNodes := 0 // verdicts whose rank failures point at their node
	for _, nv := range nvs {
		self := []string{nv.node, nv.v.Hostname, addrOf(nv.v.Node)}
		// The quarantine entries first: the first entry of a node is
		// kept, and theirs name the evidence (a node that left for its
		// hangs says hang, not excluded).
		for _, q := range nv.v.Quarantined {
			cands = append(cands, exclusionCand{keys: []string{q.Host, addrOf(q.Node)}, host: q.Host,
				evidence: string(q.Evidence), detail: q.Detail, at: q.At})
		}
		if nv.v.Kind == verdict.NodeExcluded {
			cands = append(cands, exclusionCand{keys: self, host: nv.v.Hostname,
				evidence: string(verdict.EvidenceExcluded), detail: nv.v.Reason, at: nv.v.EndedAt})
		}
		if fn := nv.v.FailingNode; fn != nil && !fn.SwappedOut { // swapped out: in Quarantined already
			cands = append(cands, exclusionCand{keys: self, host: nv.v.Hostname,
				evidence: string(verdict.EvidenceRankFailures), detail: fn.Detail, at: nv.v.EndedAt})
		}
		if nodeEvidence(nv.v) != "" {
			evidenceNodes++
		}
	}
	if len(cands) == 0 && evidenceNodes == 0 {
		return
	}
	nodes, err := r.Sched.Nodes(ctx)
	if err != nil {
		r.logf("job %s: cannot map quarantined nodes to Slurm nodes: %v", job.ID, err)
	}
	resolve := nodeResolver(nodes, nvs)
	cands = append(cands, r.failingAcrossJobs(st, job, nvs, resolve)...)
	now := r.now()
	for _, c := range cands {
		name := c.name
		for _, k := range c.keys {
			if name != "" {
				break
			}
			name = resolve(k)
		}
		if name == "" {
			r.logf("job %s: quarantined node %v (%s) matches no Slurm node; not excluded", job.ID, c.keys, c.evidence)
			continue
		}
		exp := now.Add(time.Duration(st.Settings.ExclusionTTL))
		found := false
		for i := range st.Exclusions {
			if e := &st.Exclusions[i]; e.Node == name && e.Expires.After(now) {
				found = true
				if exp.After(e.Expires) {
					e.Expires = exp
				}
			}
		}
		if found {
			continue
		}
		at := c.at
		if at.IsZero() {
			at = now
		}
		st.Exclusions = append(st.Exclusions, Exclusion{Node: name, Host: c.host, Evidence: c.evidence, Detail: c.detail, Job: job.ID, At: at, Expires: exp})
		r.logf("job %s: node %s quarantined (%s: %s), excluded until %s", job.ID, name, c.evidence, c.detail, exp.Format(time.RFC3339))
	}
}

// checkCapacity stops the chain when the exclusions leave fewer usable
// nodes than the job needs: a chain that cannot be placed must say so, not
// wait in the queue forever.
func (r *Resumer) checkCapacity(ctx context.Context, st *State, job *ChainJob) error {
	excl := st.ActiveExclusions(r.now())
	if len(excl) == 0 || job == nil {
		return nil
	}
	need := len(job.Nodes)
	if job.Slurm != nil && job.Slurm.NumNodes > need {
		need = job.Slurm.NumNodes
	}
	if need == 0 {
		return nil
	}
	nodes, err := r.Sched.Nodes(ctx)
	if err != nil {
		return nil // cannot tell; Slurm will say if it cannot place the job
	}
	parts := map[string]bool{}
	for _, n := range nodes {
		if slices.Contains(job.Nodes, n.Name) {
			for _, p := range n.Partitions {
				parts[p] = true
			}
		}
	}
	var usable []string
	for _, n := range nodes {
		inPart := len(parts) == 0
		for _, p := range n.Partitions {
			inPart = inPart || parts[p]
		}
		if inPart && !slices.Contains(excl, n.Name) {
			usable = append(usable, n.Name)
		}
	}
	if len(usable) >= need {
		return nil
	}
	r.stop(ctx, st, StopCapacity, fmt.Sprintf("excluding %s leaves %d usable node(s) (%s) but the job needs %d",
		strings.Join(excl, ","), len(usable), strings.Join(usable, ","), need))
	return errors.New("not enough nodes")
}

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// The chain's failing-node rule across jobs (docs/slurm.md, "Nodes that
// keep failing"): a node whose ranks failed in ways that point at it
// (verdict.RankFailure.NodeEvidence) in NodeFailureJobs of the latest
// NodeFailureJobWindow jobs that ran on it is excluded, even when each job
// saw it fail only once. The launcher's in-job rule counts rounds the same
// way (2 of 3, --ft-node-failure-limit).
const (
	NodeFailureJobs      = 2
	NodeFailureJobWindow = 3
)

// nodeEvidence is what in v points at its node ("" when nothing): its
// first rank failure that counts against the node.
func nodeEvidence(v verdict.Verdict) string {
	for _, f := range v.RankFailures {
		if f.NodeEvidence() {
			return fmt.Sprintf("%s in round %d", f.Text(), f.Round)
		}
	}
	return ""
}

// failingAcrossJobs records on job which of its nodes' ranks failed in
// ways that point at the node, and returns the nodes that did so in
// NodeFailureJobs of the latest NodeFailureJobWindow jobs they ran in.
func (r *Resumer) failingAcrossJobs(st *State, job *ChainJob, nvs []nodeVerdict, resolve func(string) string) []exclusionCand {
	job.NodeEvidence = nil
	hosts := map[string]string{}
	for _, nv := range nvs {
		what := nodeEvidence(nv.v)
		if what == "" {
			continue
		}
		name := ""
		for _, k := range []string{nv.node, nv.v.Hostname, addrOf(nv.v.Node)} {
			if name = resolve(k); name != "" {
				break
			}
		}
		if name == "" || slices.ContainsFunc(job.NodeEvidence, func(e NodeEvidence) bool { return e.Node == name }) {
			continue
		}
		job.NodeEvidence = append(job.NodeEvidence, NodeEvidence{Node: name, What: what})
		hosts[name] = nv.v.Hostname
	}
	var out []exclusionCand
	for _, e := range job.NodeEvidence {
		var ran []*ChainJob
		for _, j := range st.Jobs {
			if j == job || slices.Contains(j.Nodes, e.Node) || slices.ContainsFunc(j.NodeEvidence, func(x NodeEvidence) bool { return x.Node == e.Node }) {
				ran = append(ran, j)
			}
		}
		if len(ran) > NodeFailureJobWindow {
			ran = ran[len(ran)-NodeFailureJobWindow:]
		}
		var seen []string
		for _, j := range ran {
			for _, x := range j.NodeEvidence {
				if x.Node == e.Node {
					seen = append(seen, fmt.Sprintf("job %s: %s", j.ID, x.What))
				}
			}
		}
		if len(seen) < NodeFailureJobs {
			continue
		}
		out = append(out, exclusionCand{name: e.Node, host: hosts[e.Node], evidence: string(verdict.EvidenceRankFailures),
			detail: fmt.Sprintf("its ranks failed in ways that point at the node in %d of the latest %d jobs that ran on it (%s)",
				len(seen), len(ran), strings.Join(seen, "; "))})
	}
	return out
}
