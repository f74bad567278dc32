#!/usr/bin/python3
"""Node loss with a hot spare: the spare's ranks cold or on standbys.

3 launchers on loopback (127.0.0.2-4; node 0 hosts the embedded store),
--nnodes 2:3 --nproc-per-node N --prewarm torch,torch.distributed: two active
nodes and one parked spare. Ranks are bench/workers/spare_torch.py (gloo
process group, one all_reduce, a stamp after it). Once round 0 runs and the
spare has been parked for --idle seconds (so that its standbys, if it keeps
any, are ready), the active node that does not host the store is SIGKILLed.
Measured from the kill: until the spare's ranks run their first line
("start": interpreter + handover, or interpreter start) and until every rank
of round 1 has done its first all_reduce ("step": the job trains again).

Two launcher binaries side by side (alternating): --old (before parked
spares kept standbys: the spare's ranks start cold) and --new (they start on the
standbys the spare kept while parked). The active survivor restarts warm in
both (its own standbys). Prints a markdown table on stdout.

usage: spare_prewarm.py --old BIN --new BIN [--reps N] [--nproc N] [--idle S]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "spare_torch.py")


def free_port(host):
    s = socket.socket()
    s.bind((host, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def events(path, kind):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("event") == kind:
                    out.append(e)
    except OSError:
        pass
    return out


def stamps(d, name):
    out = {}
    for f in os.listdir(d):
        if f.startswith(name + "-") and not f.endswith(".tmp"):
            with open(os.path.join(d, f)) as fh:
                out[f[len(name) + 1:]] = float(fh.read())
    return out


def one(binary, nproc, idle, bound):
    d = tempfile.mkdtemp(prefix="ftl-spare-bench-")
    port = free_port("127.0.0.2")
    procs = []
    for i in range(3):
        env = dict(os.environ, OUT=d, NODE=str(i), PYTHON_EXEC="/usr/bin/python3")
        args = [binary, "--event-log", os.path.join(d, "ev%d.jsonl" % i), "--local-addr", "127.0.0.%d" % (2 + i),
                "--rdzv-endpoint", "127.0.0.2:%d" % port, "--rdzv-id", "bench-%d" % port, "--rdzv-backend", "c10d",
                "--nnodes", "2:3", "--nproc-per-node", str(nproc), "--max-restarts", "2",
                "--prewarm", "torch,torch.distributed", "--log-dir", os.path.join(d, "logs%d" % i), WORKER]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                      stderr=open(os.path.join(d, "node%d.log" % i), "w")))
        if i == 0:
            time.sleep(0.3)
    try:
        deadline = time.time() + bound
        spare = None
        while time.time() < deadline:
            steps = [k for k in stamps(d, "step") if k.startswith("0-")]
            for i in range(3):
                if events(os.path.join(d, "ev%d.jsonl" % i), "standby"):
                    spare = i
            if spare is not None and len(steps) == 2 * nproc:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("round 0 did not run in %s" % d)
        time.sleep(idle)
        victim = [i for i in (1, 2) if i != spare][0]
        ready = bool(events(os.path.join(d, "ev%d.jsonl" % spare), "prewarm_spare_ready"))
        kill = time.time()
        os.kill(procs[victim].pid, signal.SIGKILL)
        for i, p in enumerate(procs):
            if i != victim:
                if p.wait(bound) != 0:
                    raise RuntimeError("node %d exited %d (%s)" % (i, p.returncode, d))
        starts, steps = stamps(d, "start"), stamps(d, "step")
        spare_start = max(v for k, v in starts.items() if k.startswith("1-%d-" % spare))
        step = max(v for k, v in steps.items() if k.startswith("1-"))
        warm = [e for e in events(os.path.join(d, "ev%d.jsonl" % spare), "prewarm_started") if e.get("round") == "1"]
        shutil.rmtree(d)  # kept when the run failed
        return {"start": spare_start - kill, "step": step - kill, "warm": bool(warm), "ready": ready}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--idle", type=float, default=8.0)
    ap.add_argument("--bound", type=float, default=120.0)
    a = ap.parse_args()
    res = {"old": [], "new": []}
    for r in range(a.reps):
        for name in ("old", "new"):
            m = one(getattr(a, name), a.nproc, a.idle, a.bound)
            print("rep %d %s: %s" % (r, name, m), file=sys.stderr, flush=True)
            res[name].append(m)
    print("| launcher | spare's ranks | kill -> spare's ranks run (p50, each) | kill -> round 1's first all_reduce (p50, each) |")
    print("|---|---|---|---|")
    for name, label in (("old", "before (spare cold)"), ("new", "after (spare standbys)")):
        ms = res[name]
        paths = ",".join(sorted({"warm" if m["warm"] else "cold" for m in ms}))
        f = lambda k: "%.2f s (%s)" % (statistics.median(m[k] for m in ms), ", ".join("%.2f" % m[k] for m in ms))
        print("| %s | %s | %s | %s |" % (label, paths, f("start"), f("step")))


if __name__ == "__main__":
    main()
