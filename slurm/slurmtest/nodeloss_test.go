package slurmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// launcherDeathScript is a chain's batch script: job 0 runs one real
// ft-launcher per node of -N2 under `srun --kill-on-bad-exit=K ft-resumer
// node -- ft-launcher ...` (docs/slurm.md's line), no spare; each rank
// records "<launcher pid> <node>" in WORK/launcher-<procid> and sleeps.
// Later jobs record their node list and finish. The rendezvous port is a
// free one (another test binary's cluster may use 29400 on the same
// addresses).
func launcherDeathScript(t *testing.T, work string, killOnBadExit int) string {
	t.Helper()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	rank := rankScript(t, work, "rank.sh", fmt.Sprintf(`echo "$PPID $SLURMD_NODENAME" > %[1]s/launcher-$SLURM_PROCID.tmp
mv %[1]s/launcher-$SLURM_PROCID.tmp %[1]s/launcher-$SLURM_PROCID
exec sleep 300
`, work))
	return fmt.Sprintf(`#SBATCH -N2
if [ "$FT_RESUMER_JOB_INDEX" != 0 ]; then
  echo "$SLURM_JOB_NODELIST" > %[1]s/nodes-$FT_RESUMER_JOB_INDEX
  touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0
fi
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --kill-on-bad-exit=%[2]d ft-resumer node -- ft-launcher --nproc-per-node 1 --no-python --max-restarts 3 \
  --rdzv-endpoint "$head:%[3]d" %[4]s
`, work, killOnBadExit, ports[0], rank)
}

// TestLauncherDeathExcludesTheNode: on 2 nodes with no spare,
// the launcher of the node that does not host the rendezvous is SIGKILLed
// while its node stays up. Its parent `ft-resumer node` records the death
// (fatal_error, quarantined: launcher_died), so the chain excludes the node
// and the successor runs elsewhere, with --kill-on-bad-exit=0 (the
// documented line) and =1 (srun kills the other launcher before it can
// write anything). With =0 the surviving launcher ends the job at once
// with not_enough_nodes (a fixed allocation: no 30 s wait) and is not
// excluded itself; with =1 the survivor, SIGKILLed by srun together with
// its ft-resumer node, is not accused either.
func TestLauncherDeathExcludesTheNode(t *testing.T) {
	skipShort(t)
	c := need(t)
	for _, k := range []int{0, 1} {
		t.Run("kill-on-bad-exit="+strconv.Itoa(k), func(t *testing.T) {
			ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			ch := newChain(t, c)
			work := filepath.Dir(ch.dir)
			script := ch.script(launcherDeathScript(t, work, k))
			cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, "--exclusion-expiry", "1h", script)
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}()
			var victimPID int
			var victim, survivor string
			waitFor(t, 2*time.Minute, "both launchers' ranks to run", func() bool {
				a, err0 := os.ReadFile(filepath.Join(work, "launcher-0"))
				b, err1 := os.ReadFile(filepath.Join(work, "launcher-1"))
				if err0 != nil || err1 != nil {
					return false
				}
				f0, f1 := strings.Fields(string(a)), strings.Fields(string(b))
				if len(f0) != 2 || len(f1) != 2 {
					return false
				}
				victimPID, _ = strconv.Atoi(f1[0])
				survivor, victim = f0[1], f1[1]
				return true
			})
			if t.Failed() {
				t.FailNow()
			}
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", victimPID)); strings.TrimSpace(string(comm)) != "ft-launcher" {
				t.Fatalf("pid %d is %q, not the rank's ft-launcher", victimPID, comm)
			}
			// The launcher of procid 1 (n2: it does not host the etcd)
			// dies alone; its node and its ft-resumer node live on.
			if err := syscall.Kill(victimPID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			ch.waitRun(ctx, cmd, out)
			v := ch.status(ctx)
			// The end step (its outcome deferred: srun's status is a
			// signal's) gives the pending successor the exclusion before
			// this job ends, so the successor is never placed on the
			// victim: no relocation.
			if got := outcomes(v); !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
				t.Fatalf("outcomes %v, want [failure finished never_ran] (no relocation)\n%s", got, out)
			}
			jobDir := filepath.Join(ch.dir, resumer.JobsDir, v.Jobs[0].ID)
			vv, err := verdict.Read(filepath.Join(jobDir, "verdict-"+victim+".json"))
			if err != nil {
				t.Fatalf("no verdict for the killed launcher's node %s: %v\n%s", victim, err, ch.logs())
			}
			if vv.Kind != verdict.FatalError || vv.PID != victimPID || !strings.Contains(vv.Reason, "was killed by SIGKILL without a verdict") ||
				len(vv.Quarantined) != 1 || vv.Quarantined[0].Host != victim || vv.Quarantined[0].Evidence != verdict.EvidenceLauncherDied {
				t.Errorf("verdict of %s: %+v, want fatal_error by ft-resumer node, %s quarantined (launcher_died)", victim, vv, victim)
			}
			// Status names nodes as Slurm does: every fake node has this
			// machine's host name.
			for _, vs := range v.Jobs[0].Verdicts {
				if vs.File != "verdict-"+vs.Node+".json" {
					t.Errorf("status verdict %+v: want the Slurm node name of its file", vs)
				}
			}
			if q := v.Jobs[0].Quarantined; len(q) == 0 || q[0].Host != victim {
				t.Errorf("status quarantined %+v, want %s (the Slurm node name)", q, victim)
			}
			if k == 0 {
				sv, err := verdict.Read(filepath.Join(jobDir, "verdict-"+survivor+".json"))
				if err != nil {
					t.Fatalf("no verdict from the surviving launcher on %s: %v\n%s", survivor, err, ch.logs())
				}
				took := sv.EndedAt.Sub(killed)
				if sv.Kind != verdict.NotEnoughNodes || took > 30*time.Second {
					t.Errorf("survivor verdict %s %q %v after the kill; want not_enough_nodes within 30 s (no min_nodes_wait of 30 s)", sv.Kind, sv.Reason, took)
				}
				t.Logf("survivor on %s: %s %v after the kill: %s", survivor, sv.Kind, took.Round(time.Millisecond), sv.Reason)
			}
			var excluded []string
			for _, e := range v.Exclusions {
				excluded = append(excluded, e.Node)
				if e.Node == victim && (!e.Active || e.Job != v.Jobs[0].ID || (e.Evidence != string(verdict.EvidenceLauncherDied) && e.Evidence != string(verdict.EvidenceLost))) {
					t.Errorf("exclusion %+v: want %s active, from job %s, evidence launcher_died or lost", e, victim, v.Jobs[0].ID)
				}
			}
			if !slices.Contains(excluded, victim) || slices.Contains(excluded, survivor) {
				t.Errorf("excluded %v: want %s (its launcher died) and not %s", excluded, victim, survivor)
			}
			ran, _ := filepath.Glob(filepath.Join(work, "nodes-*"))
			if len(ran) != 1 {
				t.Errorf("%d later jobs ran the script (%v), want 1", len(ran), ran)
			}
			for _, f := range ran {
				nodes, err := slurm.ExpandNodeList(strings.TrimSpace(readFile(t, f)))
				if err != nil {
					t.Fatal(err)
				}
				if len(nodes) != 2 || slices.Contains(nodes, victim) {
					t.Errorf("a successor (%s) ran on %v; %s was to be excluded", filepath.Base(f), nodes, victim)
				}
			}
			if slices.Contains(v.Jobs[1].Nodes, victim) {
				t.Errorf("the chain records the finishing job on %v; %s was to be excluded", v.Jobs[1].Nodes, victim)
			}
		})
	}
}

// TestFrozenLauncherEndsWithNotEnoughNodes: a launcher frozen
// by SIGSTOP on 2 nodes with no spare looks like a dead or cut-off node to
// its peer: no connection closes, gossip falls silent, its lease runs out.
// The survivor ends the job with not_enough_nodes about lease_ttl + 1 to
// 4 s after the freeze (docs/rendezvous.md, "Fixed allocations"), not 30 s
// later. The frozen launcher is then SIGKILLed, so that the step can end.
func TestFrozenLauncherEndsWithNotEnoughNodes(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(launcherDeathScript(t, work, 0))
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, "--exclusion-expiry", "1h", script)
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	var pid int
	var survivor string
	waitFor(t, 2*time.Minute, "both launchers' ranks to run", func() bool {
		a, err0 := os.ReadFile(filepath.Join(work, "launcher-0"))
		b, err1 := os.ReadFile(filepath.Join(work, "launcher-1"))
		f0, f1 := strings.Fields(string(a)), strings.Fields(string(b))
		if err0 != nil || err1 != nil || len(f0) != 2 || len(f1) != 2 {
			return false
		}
		pid, _ = strconv.Atoi(f1[0])
		survivor = f0[1]
		return true
	})
	if t.Failed() {
		t.FailNow()
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	defer syscall.Kill(pid, syscall.SIGKILL)
	st := ch.state()
	path := filepath.Join(ch.dir, resumer.JobsDir, st.Jobs[0].ID, "verdict-"+survivor+".json")
	var sv verdict.Verdict
	waitFor(t, 90*time.Second, "the survivor's verdict", func() bool {
		var err error
		sv, err = verdict.Read(path)
		return err == nil
	})
	if t.Failed() {
		t.Fatalf("no verdict from the survivor\n%s", ch.logs())
	}
	took := sv.EndedAt.Sub(frozen)
	if sv.Kind != verdict.NotEnoughNodes || took > 45*time.Second {
		t.Errorf("survivor verdict %s %q %v after the freeze; want not_enough_nodes within 45 s", sv.Kind, sv.Reason, took)
	}
	t.Logf("survivor on %s: %s %v after the freeze: %s", survivor, sv.Kind, took.Round(time.Millisecond), sv.Reason)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ch.waitRun(ctx, cmd, out)
}
