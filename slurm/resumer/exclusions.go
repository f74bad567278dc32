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

// addExclusions records the nodes quarantined in job's verdicts (and the
// node of a verdict of kind node_excluded) as exclusions with an expiry.
func (r *Resumer) addExclusions(ctx context.Context, st *State, job *ChainJob, _ []verdict.Verdict) {
	nvs := readVerdicts(filepath.Join(st.Dir, JobsDir, job.ID))
	type cand struct {
		keys                   []string
		host, evidence, detail string
		at                     time.Time
	}
	var cands []cand
	for _, nv := range nvs {
		if nv.v.Kind == verdict.NodeExcluded {
			cands = append(cands, cand{keys: []string{nv.node, nv.v.Hostname, addrOf(nv.v.Node)}, host: nv.v.Hostname,
				evidence: string(verdict.EvidenceExcluded), detail: nv.v.Reason, at: nv.v.EndedAt})
		}
		for _, q := range nv.v.Quarantined {
			cands = append(cands, cand{keys: []string{q.Host, addrOf(q.Node)}, host: q.Host,
				evidence: string(q.Evidence), detail: q.Detail, at: q.At})
		}
	}
	if len(cands) == 0 {
		return
	}
	nodes, err := r.Sched.Nodes(ctx)
	if err != nil {
		r.logf("job %s: cannot map quarantined nodes to Slurm nodes: %v", job.ID, err)
	}
	resolve := nodeResolver(nodes, nvs)
	now := r.now()
	for _, c := range cands {
		name := ""
		for _, k := range c.keys {
			if name = resolve(k); name != "" {
				break
			}
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
