package slurmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestFailingNodeExcludedFromTheNextJob: job 0 of a chain runs one real
// ft-launcher per node of -N2 (no spare) under `srun ft-resumer node`. The
// rank on the node that does not host the rendezvous exits 1 with no
// explanation in every round: with no spare the node keeps its place, and
// when the restart budget runs out its verdict names it (failing_node).
// The chain excludes it from the successor, which runs elsewhere, and
// `ft-resumer status` names it with its Slurm node name and the evidence.
func TestFailingNodeExcludedFromTheNextJob(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	code, out, errOut, bad := failingNodeChain(t, ctx, ch, 2, "", `if [ "$SLURM_PROCID" = 1 ]; then
  echo "$SLURMD_NODENAME" > WORK/bad
  sleep 1; exit 1
fi
exec sleep 300
`)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s\n%s", code, out, errOut, ch.logs())
	}
	v := ch.status(ctx)
	// The third job is the successor job 2 pre-scheduled, cancelled once
	// training finished.
	if got := outcomes(v); !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
		t.Fatalf("outcomes %v, want [failure finished never_ran]\n%s", got, out)
	}
	jv, err := verdict.Read(filepath.Join(ch.dir, "jobs", v.Jobs[0].ID, "verdict-"+bad+".json"))
	if err != nil {
		t.Fatalf("no verdict from the failing node %s: %v\n%s", bad, err, ch.logs())
	}
	if fn := jv.FailingNode; jv.Kind != verdict.RestartBudgetExhausted || fn == nil || fn.SwappedOut || len(fn.Rounds) < 2 {
		t.Errorf("verdict of %s: %s, failing_node %+v; want restart_budget_exhausted naming the node (no spare to swap)", bad, jv.Kind, jv.FailingNode)
	}
	if len(v.Exclusions) != 1 {
		t.Fatalf("exclusions %+v, want one (%s)", v.Exclusions, bad)
	}
	e := v.Exclusions[0]
	if e.Node != bad || e.Evidence != string(verdict.EvidenceRankFailures) || !e.Active || e.Job != v.Jobs[0].ID ||
		!strings.Contains(e.Detail, "exited 1 with no explanation") {
		t.Errorf("exclusion %+v, want %s, evidence rank_failures, active, from job %s", e, bad, v.Jobs[0].ID)
	}
	nodes, err := slurm.ExpandNodeList(strings.TrimSpace(readFile(t, filepath.Join(work, "nodes-1"))))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || slices.Contains(nodes, bad) {
		t.Errorf("the successor ran on %v; %s was to be excluded", nodes, bad)
	}
	// The human status names it too.
	_, human, _ := ch.resumer(ctx, "status", "--chain-dir", ch.dir)
	if !strings.Contains(human, bad) || !strings.Contains(human, "rank_failures") {
		t.Errorf("status does not name %s with its evidence:\n%s", bad, human)
	}
}

// TestFailingNodeSwappedThenExcluded: job 0 of a chain runs a real
// ft-launcher on each of -N3 nodes, 2 active and a hot spare. The rank of
// the first active node that is not the rendezvous host exits 1 with no
// explanation in rounds 0 and 1: its node leaves for the spare at its
// second failure (quarantined: rank_failures), and the job goes on on the
// other two until its ranks fail in round 2 and the restart budget (2) is
// spent. The chain excludes the swapped-out node; the successor, which
// needs all 3 nodes, cannot be placed without it, and the chain stops
// saying so. ft-resumer status names the node and the evidence.
func TestFailingNodeSwappedThenExcluded(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	code, out, errOut, bad := failingNodeChain(t, ctx, ch, 3, "--nnodes 2:3", `head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
if [ "$SLURMD_NODENAME" != "$head" ] && mkdir WORK/claim 2>/dev/null; then echo "$SLURMD_NODENAME" > WORK/bad; fi
if [ "$TORCHELASTIC_RESTART_COUNT" -ge 2 ] || [ "$SLURMD_NODENAME" = "$(cat WORK/bad 2>/dev/null)" ]; then
  sleep 1; exit 1
fi
exec sleep 300
`)
	if code != 1 {
		t.Fatalf("ft-resumer run = %d, want 1 (stopped: the successor cannot be placed)\n%s\n%s\n%s", code, out, errOut, ch.logs())
	}
	jv, err := verdict.Read(filepath.Join(ch.dir, "jobs", ch.status(ctx).Jobs[0].ID, "verdict-"+bad+".json"))
	if err != nil {
		t.Fatalf("no verdict from the failing node %s: %v\n%s", bad, err, ch.logs())
	}
	if fn := jv.FailingNode; jv.Kind != verdict.NodeExcluded || fn == nil || !fn.SwappedOut ||
		len(jv.Quarantined) != 1 || jv.Quarantined[0].Evidence != verdict.EvidenceRankFailures {
		t.Errorf("verdict of %s: %s, failing_node %+v, quarantined %+v; want node_excluded, swapped out, quarantined with rank_failures",
			bad, jv.Kind, jv.FailingNode, jv.Quarantined)
	}
	v := ch.status(ctx)
	if len(v.Exclusions) != 1 || v.Exclusions[0].Node != bad || v.Exclusions[0].Evidence != string(verdict.EvidenceRankFailures) {
		t.Fatalf("exclusions %+v, want %s with rank_failures", v.Exclusions, bad)
	}
	if !strings.Contains(v.StopReason, "excluding "+bad) || !strings.Contains(v.StopReason, "needs 3") {
		t.Errorf("chain stopped with %q; want the capacity stop naming %s", v.StopReason, bad)
	}
	if _, err := os.Stat(filepath.Join(work, "nodes-1")); err == nil {
		t.Errorf("a successor ran: %s", readFile(t, filepath.Join(work, "nodes-1")))
	}
	_, human, _ := ch.resumer(ctx, "status", "--chain-dir", ch.dir)
	if !strings.Contains(human, bad) || !strings.Contains(human, "rank_failures") {
		t.Errorf("status does not name %s with its evidence:\n%s", bad, human)
	}
}

// failingNodeChain runs a chain whose job 0 runs one real ft-launcher per
// node of -N nodes under `srun ft-resumer node` with launcherArgs and the
// rank script rankBody (which writes the failing node's name to
// WORK/bad); later jobs record their node list and finish. It returns
// ft-resumer run's exit code and output, and the failing node.
func failingNodeChain(t *testing.T, ctx context.Context, ch *chain, nodes int, launcherArgs, rankBody string) (code int, out, errOut, bad string) {
	t.Helper()
	work := filepath.Dir(ch.dir)
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	rank := rankScript(t, work, "rank.sh", strings.ReplaceAll(rankBody, "WORK", work))
	script := ch.script(fmt.Sprintf(`#SBATCH -N%[4]d
if [ "$FT_RESUMER_JOB_INDEX" != 0 ]; then
  echo "$SLURM_JOB_NODELIST" > %[1]s/nodes-$FT_RESUMER_JOB_INDEX
  touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0
fi
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --kill-on-bad-exit=0 ft-resumer node -- ft-launcher %[5]s --nproc-per-node 1 --no-python --max-restarts 2 \
  --rdzv-endpoint "$head:%[2]d" %[3]s
`, work, ports[0], rank, nodes, launcherArgs))
	code, out, errOut = ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--exclusion-expiry", "1h", script)
	b, _ := os.ReadFile(filepath.Join(work, "bad"))
	return code, out, errOut, strings.TrimSpace(string(b))
}
