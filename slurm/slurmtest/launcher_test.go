package slurmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// These tests run one real ft-launcher per node under srun with the
// minimal launch line, nothing but --nproc-per-node (and --no-python or the
// training's own arguments): node count, run id, rendezvous endpoints
// (the cluster's node names n1..n3, which DNS does not know), the local
// address and the node order all come from the Slurm job.

// launchJob is one sbatch job running `srun ft-launcher <args>`.
type launchJob struct {
	t      *testing.T
	c      *Cluster
	work   string // per-test directory: scripts, outputs, the job's TMPDIR
	marker string // FTL_LAUNCH_MARKER in every process of the job
	ids    []string
	args   []string // extra sbatch options
}

func newLaunchJob(t *testing.T, c *Cluster) *launchJob {
	t.Helper()
	j := &launchJob{t: t, c: c, work: t.TempDir(),
		marker: fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())}
	if err := os.Mkdir(filepath.Join(j.work, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.cleanup)
	return j
}

// submit submits a script with nodes nodes whose body is body, waits for
// the job to end, checks that it ended in state want, and returns the job
// id and Slurm's final record of it.
//
// It polls Slurm's record every 200 ms rather than running sbatch --wait:
// sbatch --wait sleeps 2, 8, then 32 s between its checks (the cluster's
// MinJobAge lets it back off that far), so a job that ended after 3 s was
// noticed after 10 s and a one-minute time limit after 106 s. The wait ends
// at the same point, the job's terminal state (not COMPLETING), and is
// bounded by ctx as sbatch --wait was.
func (j *launchJob) submit(ctx context.Context, nodes int, body, want string, env ...string) (string, resumer.Job) {
	j.t.Helper()
	script := filepath.Join(j.work, "job.sh")
	full := fmt.Sprintf("#!/bin/bash\n#SBATCH -N%d -o %s/slurm-%%j.out\nenv | grep '^SLURM_' | sort > %s/batch-env\n%s\n", nodes, j.work, j.work, body)
	if err := os.WriteFile(script, []byte(full), 0o755); err != nil {
		j.t.Fatal(err)
	}
	cmd := j.c.Command(ctx, "sbatch", append(append([]string{"--parsable"}, j.args...), script)...)
	cmd.Env = append(append(cmd.Env, append([]string{"PATH=" + binDir + ":" + os.Getenv("PATH"), "FTL_LAUNCH_MARKER=" + j.marker,
		"TMPDIR=" + filepath.Join(j.work, "tmp")}, env...)...), hangdump.Env...)
	out, err := cmd.Output()
	id, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	if id != "" {
		j.ids = append(j.ids, id) // cancelled by cleanup should the test end early
	}
	if err != nil || id == "" {
		j.t.Fatalf("sbatch: %v: %s", err, out)
	}
	sched := resumer.Scheduler{Env: j.c.Env()}
	var job resumer.Job
	for {
		var jerr error
		if job, jerr = sched.Job(ctx, id); jerr == nil && job.Terminal() {
			break
		}
		if ctx.Err() != nil {
			j.t.Fatalf("job %s did not end in time (last seen %q, %v)\n%s", id, job.State, jerr, j.hung(id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if job.State != want {
		j.t.Errorf("job %s ended %s (exit %d:%d), want %s\n%s", id, job.State, job.ExitCode, job.Signal, want, j.logs())
	}
	return id, job
}

// hung describes a job that is still running when it should have ended:
// Slurm's record of it, its processes, and in short the stacks its
// launchers and ranks print on SIGABRT (hangdump.Env is in the job's
// environment); then the end of each job output. The job is cancelled by
// cleanup.
func (j *launchJob) hung(id string) string {
	report := hungReport("FTL_LAUNCH_MARKER="+j.marker, j.output)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	record, err := j.c.Run(ctx, "scontrol", "show", "job", "-o", id)
	if err != nil {
		record = err.Error()
	}
	before := j.output()
	for _, m := range []string{"Fatal Python error: Aborted", "SIGABRT: abort"} {
		if i := strings.Index(before, m); i >= 0 {
			before = before[:i]
		}
	}
	return fmt.Sprintf("Slurm's record of the job: %s\n%s\njob output up to the stacks:\n%s", record, report, tail([]byte(before), 8000))
}

// logs is the end of each job output, for failure messages.
func (j *launchJob) logs() string { return j.outputs(6000) }

// output is the whole of each job output, for assertions: a launcher's
// early line (what it hosts, where its settings came from) can be more
// than a message's worth of bytes from the end once three launchers log.
func (j *launchJob) output() string { return j.outputs(-1) }

func (j *launchJob) outputs(limit int) string {
	files, _ := filepath.Glob(filepath.Join(j.work, "slurm-*.out"))
	var b strings.Builder
	for _, f := range files {
		out, _ := os.ReadFile(f)
		s := string(out)
		if limit >= 0 {
			s = tail(out, limit)
		}
		fmt.Fprintf(&b, "== %s\n%s", filepath.Base(f), s)
	}
	return b.String()
}

// cleanup checks that nothing of the job is left: no process, no embedded
// etcd data dir in the job's TMPDIR.
func (j *launchJob) cleanup() {
	if len(j.ids) > 0 { // a test that gave up on its job
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, _ = j.c.Run(ctx, "scancel", j.ids...)
		cancel()
	}
	waitFor(j.t, 60*time.Second, "no process of the job", func() bool {
		return len(ProcessesWithEnv("FTL_LAUNCH_MARKER="+j.marker)) == 0
	})
	left, _ := filepath.Glob(filepath.Join(j.work, "tmp", "ft-launcher-etcd-*"))
	if len(left) > 0 {
		j.t.Errorf("embedded etcd data dirs left behind: %v", left)
	}
}

// TestMinimalSrunLine: `srun ft-launcher --nproc-per-node 2 --no-python
// rank.sh` with no other flag on 2 and 3 nodes: every node joins one
// rendezvous, global ranks follow SLURM_PROCID (RANK = procid * 2 + local
// rank) and the job succeeds.
func TestMinimalSrunLine(t *testing.T) {
	skipShort(t)
	c := need(t)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("N%d", n), func(t *testing.T) {
			ctx, cancel := runclock.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			j := newLaunchJob(t, c)
			ranks := filepath.Join(j.work, "ranks")
			if err := os.Mkdir(ranks, 0o755); err != nil {
				t.Fatal(err)
			}
			rank := rankScript(t, j.work, "rank.sh", fmt.Sprintf(
				`echo "$SLURM_PROCID $SLURMD_NODENAME $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $MASTER_ADDR $TORCHELASTIC_RUN_ID" > %s/rank-$RANK`, ranks))
			id, job := j.submit(ctx, n, "srun ft-launcher --nproc-per-node 2 --no-python "+rank, "COMPLETED")
			if len(job.NodeList) != n {
				t.Fatalf("job %s ran on %v, want %d nodes", id, job.NodeList, n)
			}
			files, _ := filepath.Glob(filepath.Join(ranks, "rank-*"))
			if len(files) != 2*n {
				t.Fatalf("%d ranks ran, want %d\n%s", len(files), 2*n, j.logs())
			}
			nodes := map[string]bool{}
			for r := 0; r < 2*n; r++ {
				b, err := os.ReadFile(filepath.Join(ranks, "rank-"+strconv.Itoa(r)))
				if err != nil {
					t.Fatal(err)
				}
				f := strings.Fields(string(b))
				if len(f) != 7 {
					t.Fatalf("rank %d wrote %q", r, b)
				}
				procID, _ := strconv.Atoi(f[0])
				local, _ := strconv.Atoi(f[2])
				if procID*2+local != r || f[3] != f[0] || f[4] != strconv.Itoa(2*n) {
					t.Errorf("rank %d: SLURM_PROCID %s, LOCAL_RANK %s, GROUP_RANK %s, WORLD_SIZE %s; want RANK = procid*2 + local rank, group rank = procid, world %d",
						r, f[0], f[2], f[3], f[4], 2*n)
				}
				// MASTER_ADDR is procid 0's node address (n1 is 127.0.0.2), resolved through scontrol.
				if f[5] != c.Nodes[0].Addr || f[6] != id+"-r0" {
					t.Errorf("rank %d: MASTER_ADDR %s, run id %s; want %s and %s-r0", r, f[5], f[6], c.Nodes[0].Addr, id)
				}
				nodes[f[1]] = true
			}
			if len(nodes) != n {
				t.Errorf("ranks ran on nodes %v, want %d distinct", nodes, n)
			}
			// The launchers said where their settings came from.
			logs := j.output()
			members := "1"
			if n >= 3 {
				members = "3"
			}
			if !strings.Contains(logs, `msg="hosting the embedded etcd rendezvous"`) || !strings.Contains(logs, "members="+members) {
				t.Errorf("no launcher hosted a %s-member embedded etcd:\n%s", members, logs)
			}
			if t.Failed() {
				env, _ := os.ReadFile(filepath.Join(j.work, "batch-env"))
				t.Logf("batch script environment:\n%s", env)
			}
		})
	}
}

// TestMinimalSrunLineTrainsDDP: the example DDP training (gloo, CPU) trains
// to the end on two nodes under `srun ft-launcher --nproc-per-node 2
// ddp_train.py ...` with no other launcher flag.
func TestMinimalSrunLineTrainsDDP(t *testing.T) {
	skipShort(t)
	c := need(t)
	testenv.Require(t, testenv.Torch)
	ctx, cancel := runclock.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := newLaunchJob(t, c)
	train := filepath.Join(repoRoot, "examples", "ddp_train.py")
	out := filepath.Join(j.work, "w.json")
	j.submit(ctx, 2, fmt.Sprintf("srun ft-launcher --nproc-per-node 2 %s --steps 20 --ckpt-every 10 --ckpt-dir %s --out %s",
		train, filepath.Join(j.work, "ckpt"), out), "COMPLETED", "PYTHON_EXEC=/usr/bin/python3")
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("no final weights: %v\n%s", err, j.logs())
	}
	var w struct {
		SHA256    string `json:"sha256"`
		Steps     int    `json:"steps"`
		WorldSize int    `json:"world_size"`
	}
	if err := json.Unmarshal(b, &w); err != nil || w.SHA256 == "" || w.Steps != 20 || w.WorldSize != 4 {
		t.Errorf("final weights %s (%v): want a hash after 20 steps with world size 4", b, err)
	}
}

// TestNvrxSlurmLine: nvrx's launch line, unchanged, with the rendezvous
// host given by node name (here the job's second node, which DNS does not
// know): the launcher on that node hosts the embedded etcd, the job succeeds.
func TestNvrxSlurmLine(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := newLaunchJob(t, c)
	rank := rankScript(t, j.work, "rank.sh", `echo "rank $RANK of $WORLD_SIZE on $SLURMD_NODENAME"`)
	_, job := j.submit(ctx, 2, `RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n 1)
srun ft-launcher --rdzv_backend=c10d --rdzv_endpoint=$RDZV_HOST:29500 --nnodes=2 --nproc_per_node=1 --rdzv-id=$SLURM_JOB_ID \
    --ft-param-rank_heartbeat_timeout=60 --fault-tol-cfg-path=/nonexistent.yaml --ignore-missing-fault-tol-cfg --no-python `+rank, "COMPLETED")
	logs := j.output()
	host := job.NodeList[len(job.NodeList)-1]
	for _, want := range []string{"rank 0 of 2", "rank 1 of 2",
		fmt.Sprintf(`decided_by="endpoint %s:29500 (%s) is this node (Slurm node name %s)"`, host, c.Nodes[len(job.NodeList)-1].Addr, host)} {
		if !strings.Contains(logs, want) {
			t.Errorf("job output lacks %q:\n%s", want, logs)
		}
	}
}

// TestNoLauncherHostsSaysSo: an endpoint on a node outside the step (n3 in
// a two-node job): no launcher hosts the embedded etcd, and each says so
// with what it compared, instead of only "unreachable".
func TestNoLauncherHostsSaysSo(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := newLaunchJob(t, c)
	rank := rankScript(t, j.work, "rank.sh", "true")
	n3 := c.Nodes[2]
	j.args = []string{"-w", c.Nodes[0].Name + "," + c.Nodes[1].Name}
	ports, err := freePorts(1) // a port nothing listens on, not even a wildcard listener
	if err != nil {
		t.Fatal(err)
	}
	j.submit(ctx, 2, fmt.Sprintf("srun ft-launcher --nproc-per-node 1 --no-python --rdzv-endpoint %s:%d --rdzv-conf connect_timeout=5 %s",
		n3.Name, ports[0], rank), "FAILED")
	logs := j.output()
	for _, node := range c.Nodes[:2] {
		want := fmt.Sprintf("no launcher hosts the embedded etcd at %s:%d (%s:%d)? The launcher whose --local-addr (else its host name, Slurm node name or an address of its node) matches an endpoint hosts it, or the one given --rdzv-conf is_host=1; this node's addresses were %s (local address, from SLURMD_NODENAME %s)",
			n3.Name, ports[0], n3.Addr, ports[0], node.Addr, node.Name)
		if !strings.Contains(logs, want) {
			t.Errorf("job output lacks %q:\n%s", want, logs)
		}
	}
	// Said at once, not only when connect_timeout ran out.
	if !strings.Contains(logs, "nothing listens at the embedded etcd's endpoints yet") {
		t.Errorf("no early warning:\n%s", logs)
	}
}

// TestSrunWithRelays: the two-level join on a real allocation (--rdzv-conf
// relay_group=2, a job secret): on 3 nodes, n1 is the relay of n1 and n2
// and n3 its own; n2's registrations in both rounds (a rank crash
// restarts the job once) go through n1's relay port, the ranks run and
// the job succeeds.
func TestSrunWithRelays(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	j := newLaunchJob(t, c)
	secret := filepath.Join(j.work, "job-secret")
	if err := os.WriteFile(secret, []byte("relay-test-secret-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	// Group rank 1's rank fails in the first round only.
	rank := rankScript(t, j.work, "rank.sh", `if [ "$GROUP_RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 3; fi
echo "rank $RANK of $WORLD_SIZE in round $TORCHELASTIC_RESTART_COUNT"`)
	j.submit(ctx, 3, fmt.Sprintf("srun ft-launcher --nproc-per-node 1 --no-python --max-restarts 2 --job-secret-file %s --rdzv-conf relay_group=2,relay_port=%d %s",
		secret, ports[0], rank), "COMPLETED")
	logs := j.output()
	relayOf := net.JoinHostPort(c.Nodes[0].Addr, strconv.Itoa(ports[0]))
	for _, want := range []string{
		"addr=" + relayOf + " group=2 node_index=0",
		"addr=" + net.JoinHostPort(c.Nodes[2].Addr, strconv.Itoa(ports[0])) + " group=2 node_index=2",
		"name=relay network=tcp address=" + relayOf,
		"rank 0 of 3 in round 1", "rank 1 of 3 in round 1", "rank 2 of 3 in round 1",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("job output lacks %q:\n%s", want, logs)
		}
	}
	if n := strings.Count(logs, "registered_by_relay="+relayOf); n < 2 {
		t.Errorf("n2 registered through n1's relay in %d rounds, want 2 (round 0 and the restart):\n%s", n, logs)
	}
}
