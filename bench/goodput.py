#!/usr/bin/python3
"""Goodput campaign: 2 nodes x 2 ranks on loopback, a random fault
every --interval seconds for --duration seconds, the same seeded schedule for
ft-launcher, torchrun and nvrx's ft_launcher, each running the same training
script (bench/workers/goodput_train.py) with its best restart path.

Faults (kind and target rank drawn from random.Random(--seed)):
  crash  the target rank's process gets SIGKILL
  hang   the target rank's process gets SIGSTOP (it stays frozen: found by
         the launcher's heartbeat timeout, or by the process group's timeout)
  node   the launcher of the target rank's node gets SIGKILL, then at once
         every process under it (the node is gone). The node hosting the
         rendezvous (node 0: the embedded etcd, the c10d store) is never
         chosen: with a single rendezvous host its loss ends any of the three
         jobs; when the target rank is on it, the other active node is taken.
What brings a killed node back:
  ft        --nnodes 2:3 with a third launcher parked as a hot spare: the
            spare takes the lost node's place (docs/spares.md); the harness
            then starts a new spare on a fresh 127.0.0.x address (a launcher
            on the lost node's address would be quarantined).
  torchrun, nvrx
            --nnodes 2; the harness restarts the killed agent at once on the
            same address, as Slurm or Kubernetes would (with no delay: the
            best case for them). An elastic 2:3 with a waiting third agent is
            not their best path: under torchrun's c10d a waiting agent makes
            the running agents restart their workers to admit it.
Launcher options (best restart path of each):
  ft        --restart-mode in-process --prewarm auto --state-dir (saves every
            step into launcher memory, replicated to a buddy node), no
            timeout configured: the default clocks, judged from the ranks'
            stacks (docs/timeouts.md); --ft-clock 10 gives it
            --ft-rank-heartbeat-timeout 10 as before
  nvrx      --ft-rank-heartbeat-timeout 10 (its heartbeat hang detection),
            full restarts (its only mode in 0.6.0); in the trixie chroot
            (torch 2.6, Python 3.13), bench/trixie.sh's
  torchrun  Debian's torchrun (torch 1.13) through
            /work/shared/bench/torchrun-py311.py; c10d rendezvous
All: process group (gloo) timeout GOODPUT_PG_TIMEOUT (15 s), a file checkpoint
every --ckpt-every seconds (300) by rank 0.

Goodput = productive time / wall time. Wall time: from the first launcher's
start to the stop signal at --duration. Productive time, from rank 0's step
log: for each run of the training loop (a process's or an in-process
restart's), from its start (after imports, process group, restore) to the
end of its last step that the next run did not redo (the next run's restore
step); the last run to its last step. This is ft-resumer report's definition
(productive = every rank heartbeating -> the last checkpoint before the
fault), computed from the script's own log so that it applies to all three;
for ft-launcher the report's own number is given too.
Lost time per fault: the gap in productive time around the fault: recompute
(the last kept step -> the fault) + restart (the fault -> the next run's
start). A fault that lands inside an earlier fault's gap adds to that gap.

usage: bench/goodput.py [--launchers ft,torchrun,nvrx] [--duration 600]
           [--interval 60] [--seed 30] [--ckpt-every 300] [--out DIR]
           [--ft-clock default|SECONDS] [--ft-launcher PATH] [--ft-resumer PATH] [--analyse]
Writes DIR/<launcher>/ (logs, event logs, step logs, campaign.json,
goodput.json), DIR/summary.json and a markdown table on stdout; --analyse
recomputes them from an earlier run's DIR. Needs root for nvrx (unshare -m, chroot; mounts
are private to the chroot's mount namespace and vanish with it).
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "workers", "goodput_train.py")
TORCHRUN = "/work/shared/bench/torchrun-py311.py"
TRIXIE = os.environ.get("TRIXIE_ROOT", "/work/trixie")
KINDS = ("crash", "hang", "node")
NPROC = 2


def log(msg):
    print(f"[goodput {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def schedule(seed, duration, interval):
    rng = random.Random(seed)
    out, t = [], interval
    while t < duration:
        out.append({"at": t, "kind": rng.choice(KINDS), "rank": rng.randrange(2 * NPROC)})
        t += interval
    return out


def ppid_map():
    m = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    m[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return m


def descendants(pid, m=None):
    m = m or ppid_map()
    kids, out = {}, []
    for p, pp in m.items():
        kids.setdefault(pp, []).append(p)
    todo = [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def kill_tree(pid):
    """SIGKILL pid, then everything under it (collected first)."""
    tree = descendants(pid)
    for p in [pid] + tree:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return tree


class Node:
    def __init__(self, idx, addr, proc, logf):
        self.idx, self.addr, self.proc, self.logf = idx, addr, proc, logf


class Campaign:
    def __init__(self, kind, a, root):
        self.kind, self.a = kind, a
        self.dir = os.path.join(root, kind)
        os.makedirs(os.path.join(self.dir, "pids"))
        self.port = free_port("127.0.0.2" if kind == "ft" else "127.0.0.1")
        self.run_id = f"goodput-{kind}-{int(time.time())}"
        self.nodes, self.events, self.stopped, self.killed = [], [], [], []
        self.next_addr = 2
        self.t0 = None

    def env(self):
        e = dict(os.environ)
        e.update(GOODPUT_LAUNCHER=self.kind, GOODPUT_DIR=self.dir, GOODPUT_T0=f"{self.t0:.3f}",
                 GOODPUT_CKPT_EVERY=str(self.a.ckpt_every), OMP_NUM_THREADS="1",
                 PYTHON_EXEC="/usr/bin/python3", PYTHONUNBUFFERED="1")
        if self.kind == "nvrx":
            e["PYTHONPATH"] = os.path.join(REPO, ".nvrx")
        return e

    def ft_prewarm(self):
        if self.a.ft_prewarm == "off":
            return []
        return ["--prewarm", self.a.ft_prewarm]

    def ft_clock(self):
        if self.a.ft_clock == "default":
            return []
        return ["--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", self.a.ft_clock]

    def argv(self, idx, addr):
        tag = f"node{idx}"
        logs = os.path.join(self.dir, "logs", tag)
        if self.kind == "ft":
            return [self.a.ft_launcher, "--nnodes", "2:3", "--nproc-per-node", str(NPROC),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.2:{self.port}",
                    "--rdzv-id", self.run_id, "--local-addr", addr, "--max-restarts", "1000",
                    "--restart-mode", "in-process", *self.ft_prewarm(),
                    "--state-dir", os.path.join(self.dir, "state", tag),
                    "--event-log", os.path.join(self.dir, f"events-{tag}.jsonl"),
                    "--verdict-file", os.path.join(self.dir, f"verdict-{tag}.json"),
                    *self.ft_clock(), *([ "--ft-log-level", "DEBUG"] if os.environ.get("GOODPUT_DEBUG") else []), "--log-dir", logs, SCRIPT]
        if self.kind == "torchrun":
            return ["/usr/bin/python3", TORCHRUN, "--nnodes", "2", "--nproc_per_node", str(NPROC),
                    "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{self.port}",
                    "--rdzv_id", self.run_id, "--rdzv_conf", f"is_host={1 if idx == 0 else 0}",
                    "--max_restarts", "1000", "--monitor_interval", "0.3", "--log_dir", logs,
                    SCRIPT]
        inner = ["python3", "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
                 "--nnodes", "2", "--nproc-per-node", str(NPROC),
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                 "--rdzv-id", self.run_id, "--rdzv-conf", f"is_host={1 if idx == 0 else 0}",
                 "--max-restarts", "1000", "--monitor-interval", "0.3",
                 "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "10",
                 "--log-dir", logs, SCRIPT]
        # A private mount namespace: the binds vanish with the chroot's last
        # process; the same paths inside as outside.
        mounts = " && ".join([
            f"mkdir -p {TRIXIE}{REPO} {TRIXIE}{self.a.out}",
            f"mount --bind {REPO} {TRIXIE}{REPO}",
            f"mount --bind {self.a.out} {TRIXIE}{self.a.out}",
            f"mount -t proc proc {TRIXIE}/proc",
            f"mount --rbind /dev {TRIXIE}/dev"])
        return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                mounts + ' && exec chroot ' + TRIXIE + ' sh -c \'cd "$0" && exec "$@"\' ' + REPO + " "
                + " ".join(inner)]

    def start_node(self, idx, addr):
        logf = open(os.path.join(self.dir, f"launcher-node{idx}-{addr}.log"), "ab")
        p = subprocess.Popen(self.argv(idx, addr), stdout=logf, stderr=subprocess.STDOUT,
                             env=self.env(), start_new_session=True, cwd=REPO)
        n = Node(idx, addr, p, logf)
        self.nodes.append(n)
        log(f"{self.kind}: node {idx} on {addr}: pid {p.pid}")
        return n

    def start(self):
        self.t0 = time.time()
        count = 3 if self.kind == "ft" else 2
        for i in range(count):
            self.start_node(i, f"127.0.0.{self.next_addr}")
            self.next_addr += 1
            time.sleep(0.5)

    def live_nodes(self):
        return [n for n in self.nodes if n.proc.poll() is None]

    def rank_pid(self, r):
        try:
            with open(os.path.join(self.dir, "pids", f"rank-{r}")) as f:
                pid = int(f.read())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def node_of(self, pid, m):
        live = {n.proc.pid: n for n in self.live_nodes()}
        while pid and pid > 1:
            if pid in live:
                return live[pid]
            pid = m.get(pid)
        return None

    def inject(self, f):
        rec = dict(f, t=time.time())
        pid = self.rank_pid(f["rank"])
        rec["pid"] = pid
        if pid is None:
            rec["result"] = "no live process for that rank (the job was restarting)"
        elif f["kind"] == "crash":
            os.kill(pid, signal.SIGKILL)
            rec["result"] = "SIGKILL"
        elif f["kind"] == "hang":
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append(pid)
            rec["result"] = "SIGSTOP"
        else:
            m = ppid_map()
            node = self.node_of(pid, m)
            if node is not None and node.idx == 0:
                others = []
                for r in range(2 * NPROC):
                    p = self.rank_pid(r)
                    n = self.node_of(p, m) if p else None
                    if n is not None and n.idx != 0:
                        others.append(n)
                node = others[0] if others else None
            if node is None:
                rec["result"] = "no active node other than the rendezvous host"
            else:
                tree = kill_tree(node.proc.pid)
                node.proc.wait()
                self.killed.append(node.proc.pid)
                rec.update(result=f"SIGKILL launcher {node.proc.pid} on {node.addr} and {len(tree)} processes",
                           node=node.addr)
                if self.kind == "ft":
                    n = self.start_node(len(self.nodes), f"127.0.0.{self.next_addr}")
                    self.next_addr += 1
                    rec["replacement"] = f"new spare on {n.addr}"
                else:
                    n = self.start_node(node.idx, node.addr)
                    rec["replacement"] = f"agent restarted on {n.addr}"
        self.events.append(rec)
        log(f"{self.kind}: t={rec['t'] - self.t0:.1f}s {f['kind']} rank {f['rank']}: {rec['result']}")

    def stop(self):
        self.t_end = time.time()
        for n in self.live_nodes():
            try:
                os.killpg(n.proc.pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.time() + 40
        while time.time() < deadline and self.live_nodes():
            time.sleep(0.5)
        self.t_exit = time.time()
        for n in self.nodes:
            if n.proc.poll() is None:
                log(f"{self.kind}: node {n.addr} still running 40 s after SIGTERM: SIGKILL")
            kill_tree(n.proc.pid)
            n.proc.wait()
            n.logf.close()
        for pid in self.stopped:  # frozen ranks left over, in case nothing killed them
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in self.killed:  # segments of SIGKILLed launchers (docs/state.md, limits)
            for d in os.listdir("/dev/shm"):
                if d.startswith(f"ft-launcher-state-{pid}-"):
                    shutil.rmtree(os.path.join("/dev/shm", d), ignore_errors=True)

    def run(self):
        faults = schedule(self.a.seed, self.a.duration, self.a.interval)
        self.start()
        for f in faults:
            time.sleep(max(0, self.t0 + f["at"] - time.time()))
            self.inject(f)
        time.sleep(max(0, self.t0 + self.a.duration - time.time()))
        self.stop()
        with open(os.path.join(self.dir, "campaign.json"), "w") as f:
            json.dump({"t0": self.t0, "t_end": self.t_end, "events": self.events}, f, indent=1)
        return self.analyse()

    def analyse(self):
        runs = []
        with open(os.path.join(self.dir, "steps-rank0.log")) as f:
            for line in f:
                p = line.split()
                if p[0] == "B":
                    runs.append({"pid": int(p[1]), "round": int(p[2]), "start": int(p[3]),
                                 "t": float(p[4]), "src": " ".join(p[5:]), "steps": []})
                elif p[0] == "S" and runs:
                    runs[-1]["steps"].append((int(p[1]), float(p[2])))
        # A run's productive time ends at the first fault that hit it: a
        # frozen rank may finish its step after the fault (ft-launcher sends
        # SIGCONT before SIGKILL), and that step's time spans the stall.
        hits = sorted(e["t"] for e in self.events if e.get("pid"))
        intervals = []
        for i, r in enumerate(runs):
            nxt = runs[i + 1]["start"] if i + 1 < len(runs) else None
            nxt_t = runs[i + 1]["t"] if i + 1 < len(runs) else self.t_end
            cap = min([tf for tf in hits if r["t"] < tf <= nxt_t] + [self.t_end])
            kept = [t for s, t in r["steps"] if (nxt is None or s < nxt) and t <= self.t_end]
            r["kept_steps"] = len(kept)
            if kept:
                intervals.append((r["t"], min(kept[-1], cap)))
        productive = sum(b - a for a, b in intervals)
        wall = self.t_end - self.t0
        faults, prev = [], self.t0
        for e in self.events:
            tf = e["t"]
            hit = [r for r in runs if r["t"] <= tf]
            r = hit[-1] if hit else None
            later = [x["t"] for x in runs if x["t"] > tf]
            rec = {"at": round(tf - self.t0, 1), "kind": e["kind"], "rank": e["rank"], "result": e["result"],
                   "restart_s": round((later[0] if later else self.t_end) - tf, 2)}
            steps_before = [t for s, t in r["steps"] if t <= tf] if r else []
            if r is None or not steps_before or steps_before[-1] < prev:
                # No run was training when it hit: it landed in an earlier
                # fault's recovery (or before the first step).
                rec["recompute_s"] = 0.0
                rec["during_recovery"] = True
            else:
                i = runs.index(r)
                nxt = runs[i + 1]["start"] if i + 1 < len(runs) else None
                kept = [t for s, t in r["steps"] if t <= tf and (nxt is None or s < nxt)]
                rec["recompute_s"] = round(max(0.0, tf - (kept[-1] if kept else r["t"])), 2)
            rec["lost_s"] = round(rec["recompute_s"] + rec["restart_s"], 2)
            faults.append(rec)
            prev = tf
        steps_total = sum(len(r["steps"]) for r in runs)
        kept_total = sum(r["kept_steps"] for r in runs)
        out = {"launcher": self.kind, "wall_s": round(wall, 1), "productive_s": round(productive, 1),
               "goodput": round(productive / wall, 4), "runs": len(runs), "steps_done": steps_total,
               "steps_kept": kept_total, "faults": faults,
               "restore_sources": [r["src"] for r in runs],
               "loadavg_end": open("/proc/loadavg").read().split()[:3]}
        with open(os.path.join(self.dir, "goodput.json"), "w") as f:
            json.dump(out, f, indent=1)
        return out


def report(a, root):
    """ft-resumer report over the ft-launcher campaign's event logs."""
    d = os.path.join(root, "ft")
    argv = [a.ft_resumer, "report", "-o", os.path.join(d, "report.html"), "--json"]
    for n in sorted(os.listdir(d)):
        if n.startswith("events-"):
            argv += ["--event-log", os.path.join(d, n)]
        if n.startswith("verdict-"):
            argv += ["--verdict", os.path.join(d, n)]
    r = subprocess.run(argv, capture_output=True, text=True)
    with open(os.path.join(d, "report.json"), "w") as f:
        f.write(r.stdout)
    if r.returncode != 0:
        log(f"ft-resumer report failed: {r.stderr.strip()[-500:]}")
        return None
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launchers", default="ft,torchrun,nvrx")
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--interval", type=float, default=60)
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--ckpt-every", type=float, default=300)
    ap.add_argument("--out", default=f"/tmp/goodput-{int(time.time())}")
    ap.add_argument("--ft-prewarm", default="auto",
                    help="ft-launcher's --prewarm (auto, a module list, or off: none)")
    ap.add_argument("--ft-clock", default="default",
                    help="ft's hang clock: 'default' (no timeout configured) or a heartbeat timeout in seconds")
    ap.add_argument("--ft-launcher", default=os.path.join(REPO, "bin", "ft-launcher"))
    ap.add_argument("--ft-resumer", default=os.path.join(REPO, "bin", "ft-resumer"))
    ap.add_argument("--analyse", action="store_true",
                    help="only recompute the goodput of the campaigns already in --out (their campaign.json)")
    a = ap.parse_args()
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    kinds = a.launchers.split(",")
    for k in kinds:
        if k not in ("ft", "torchrun", "nvrx"):
            sys.exit(f"goodput.py: unknown launcher {k!r}: ft, torchrun or nvrx")
    if "nvrx" in kinds and not a.analyse:
        init = os.path.join(TRIXIE, "usr/lib/python3/dist-packages/torch/distributed/__init__.py")
        if not os.path.isdir(os.path.join(REPO, ".nvrx", "nvidia_resiliency_ext")):
            sys.exit("goodput.py: .nvrx is missing: assemble it with bench/gpu/nvrx.sh (see bench/README.md)")
        if not os.path.exists(init) or "ft-launcher bench" not in open(init).read():
            sys.exit(f"goodput.py: {TRIXIE} is not a chroot prepared by bench/trixie.sh (torch 2.6 with the "
                     "TCPStore change): run bench/trixie.sh once, or set TRIXIE_ROOT")
    if "ft" in kinds and not a.analyse and not os.access(a.ft_launcher, os.X_OK):
        sys.exit(f"goodput.py: no ft-launcher at {a.ft_launcher}: go build -o bin/ ./cmd/... or pass --ft-launcher")
    log(f"schedule (seed {a.seed}): {schedule(a.seed, a.duration, a.interval)}")
    results = {}
    for k in kinds if a.analyse else ():
        c = Campaign.__new__(Campaign)
        c.kind, c.a, c.dir = k, a, os.path.join(a.out, k)
        with open(os.path.join(c.dir, "campaign.json")) as f:
            saved = json.load(f)
        c.t0, c.t_end, c.events = saved["t0"], saved["t_end"], saved["events"]
        with open(os.path.join(c.dir, "goodput.json")) as f:
            old = json.load(f)
        results[k] = c.analyse()
        results[k]["loadavg_start"], results[k]["loadavg_end"] = old["loadavg_start"], old["loadavg_end"]
        rep = os.path.join(c.dir, "report.json")
        if os.path.exists(rep):
            with open(rep) as f:
                r = json.load(f)
            results[k]["report"] = {x: r.get(x) for x in ("goodput", "wall_s", "phases_s")}
    for k in kinds if not a.analyse else ():
        load0 = open("/proc/loadavg").read().split()[:3]
        c = Campaign(k, a, a.out)
        res = c.run()
        res["loadavg_start"] = load0
        with open(os.path.join(c.dir, "goodput.json"), "w") as f:
            json.dump(res, f, indent=1)
        results[k] = res
        log(f"{k}: goodput {res['goodput']:.2%} ({res['productive_s']} of {res['wall_s']} s)")
        time.sleep(3)
    if "ft" in kinds and not a.analyse:
        rep = report(a, a.out)
        if rep is not None:
            results["ft"]["report"] = {k: rep.get(k) for k in ("goodput", "wall_s", "phases_s")}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| launcher | goodput | productive / wall (s) | faults | worst fault (s) | load avg |")
    print("|---|---:|---:|---:|---:|---|")
    for k, r in results.items():
        worst = max(r["faults"], key=lambda x: x["lost_s"], default=None)
        w = f"{worst['lost_s']} ({worst['kind']} at {worst['at']} s)" if worst else "-"
        print(f"| {k} | {r['goodput']:.2%} | {r['productive_s']} / {r['wall_s']} | {len(r['faults'])} | {w} | "
              f"{' '.join(r['loadavg_start'])} -> {' '.join(r['loadavg_end'])} |")
    for k, r in results.items():
        print(f"\n{k}: per fault (at s, kind, rank: recompute + restart = lost s)")
        for x in r["faults"]:
            print(f"- {x['at']} {x['kind']} rank {x['rank']}: {x['recompute_s']} + {x['restart_s']} = "
                  f"{x['lost_s']}{' (during an earlier recovery)' if x.get('during_recovery') else ''} [{x['result']}]")


if __name__ == "__main__":
    main()
