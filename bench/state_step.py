#!/usr/bin/python3
"""Step time of a training loop with launcher-held saves written out in the
background, against the same loop without checkpoints (docs/benchmarks.md,
"State save and restore").

One rank of this file runs under the real ft-launcher with --state-dir and
--state-persist-every 1 (every save written to the state directory by the
launcher's background writer, the heaviest setting). The worker alternates
blocks of --block-steps steps:
  none     no checkpoints
  persist  state.save every --save-every steps, each written out by the
           launcher while the loop trains on
After a persist block it waits until the launcher has written its last save
(the manifest names its step), so that no write spills into the next none
block. Alternating blocks within one process lets the load of a shared
machine fall on both alike. Prints the median and worst over blocks of the
mean step time (save stalls included), of the mean time of the steps
without a save (what the writer's disk and CPU use costs the loop: with a
save every few steps the writer is busy through most of a persist block),
and of the loop thread's CPU time, per step and per step without a save
(time.thread_time: insensitive to other processes taking the CPU,
sensitive to the memory bandwidth the writer takes and to the stall), each
against "none". Then the paired comparison, which tells a small effect
from the drift of a shared machine better: each persist block against the
mean of the none blocks beside it (before and after), the median of these
ratios over the pairs, their quartiles, and a bootstrap 90% interval of the
median (more, shorter blocks give more pairs: e.g. --blocks 24
--block-steps 8).

A step: --mm matrix products of 512x512 plus an optimizer-like pass over the
whole state (every tensor t += 1e-6), one thread.

    go build -o /tmp/ft-launcher ./cmd/ft-launcher
    /usr/bin/python3 bench/state_step.py --ft-launcher /tmp/ft-launcher --mib 256 --blocks 8 --block-steps 16 --save-every 4
"""
import argparse
import json
import random
import resource
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(a):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
    from ft_launcher_client import state

    torch.set_num_threads(1)
    st = {"w%d" % i: torch.randn(4 << 20) for i in range(a.mib // 16)}
    x = torch.randn(512, 512)
    manifest = os.path.join(os.environ[state.DIR_ENV], "rank-0.json")
    blocks, step = [], 0

    def one(save):
        nonlocal x, step
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(a.mm):
            x = torch.tanh(x @ x / 512.0)
        with torch.no_grad():
            for v in st.values():
                v.add_(1e-6)
        stall = None
        if save:
            s = time.perf_counter()
            state.save(step, st)
            stall = time.perf_counter() - s
        step += 1
        return time.perf_counter() - t, stall, time.thread_time() - c

    for _ in range(a.warmup):
        one(False)
    for b in range(a.blocks):
        kind = ("none", "persist")[b % 2]
        steps = [one(kind == "persist" and (i + 1) % a.save_every == 0) for i in range(a.block_steps)]
        blocks.append({"kind": kind, "steps": steps})
        if kind == "persist":  # the launcher's write of the last save is done
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    with open(manifest) as f:
                        if json.load(f)["step"] == step - 1:
                            break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.05)
            else:
                sys.exit("the launcher did not write step %d out within 60 s" % (step - 1))
    with open(a.out, "w") as f:
        json.dump({"blocks": blocks, "cpu": sum(os.times()[:2])}, f)


def driver(a):
    tmp = tempfile.mkdtemp(prefix="ftstate-step-", dir="/var/tmp")
    load0 = os.getloadavg()[0]
    t0 = time.time()
    try:
        out, sdir = os.path.join(tmp, "steps.json"), os.path.join(tmp, "state")
        evlog = os.path.join(tmp, "events.jsonl")
        cmd = [a.ft_launcher, "--standalone", "--nproc-per-node", "1", "--state-dir", sdir, "--state-persist-every", "1",
               "--event-log", evlog,
               os.path.abspath(__file__), "--worker", "--out", out, "--mib", str(a.mib), "--blocks", str(a.blocks),
               "--block-steps", str(a.block_steps), "--mm", str(a.mm), "--save-every", str(a.save_every),
               "--warmup", str(a.warmup)]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, env=dict(os.environ, PYTHON_EXEC=sys.executable), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            sys.exit("run failed (exit %d):\n%s" % (p.returncode, p.stdout.decode()[-3000:]))
        with open(out) as f:
            got = json.load(f)
        blocks = got["blocks"]
        # The launcher's own CPU: its children's (the rank's, reaped by it)
        # taken out. An upper bound on the writer's: it includes the
        # launcher's start, its polls and the final write-out.
        launcher_cpu = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) - got["cpu"]
        writes = []
        with open(evlog) as f:
            for line in f:
                e = json.loads(line)
                if e.get("event") == "state_persisted":
                    writes.append(e["write_ms"])
        written = [n for n in os.listdir(sdir) if n.endswith(".ftstate")]
        assert written, os.listdir(sdir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {"none": [], "persist": []}
    for b in blocks:
        st = [d for d, _, _ in b["steps"]]
        plain = [d for d, s, _ in b["steps"] if s is None]
        stalls = [s for _, s, _ in b["steps"] if s is not None]
        res[b["kind"]].append({"mean": statistics.mean(st), "plain": statistics.mean(plain),
                               "cpu": statistics.mean(c for _, _, c in b["steps"]),
                               "cpuplain": statistics.mean(c for _, s, c in b["steps"] if s is None),
                               "stall": statistics.median(stalls) if stalls else 0.0})
    print("%d MiB state, %d blocks of %d steps alternating (none, persist: a save every %d steps, each written out), "
          "one run; load average %.1f at start, %.1f at end, %.0f s" % (a.mib, a.blocks, a.block_steps, a.save_every,
                                                                       load0, os.getloadavg()[0], time.time() - t0))
    print("launcher: %d write-outs of %d MiB, write_ms median %.0f (max %.0f); the launcher's CPU time %.2f s in all, "
          "%.0f ms per write-out at most" % (len(writes), a.mib, statistics.median(writes), max(writes), launcher_cpu,
                                            1000 * launcher_cpu / len(writes)))
    paired(blocks, res)
    ms = ("mean", "plain", "cpu", "cpuplain")
    base = {m: statistics.median(x[m] for x in res["none"]) for m in ms}
    print("| blocks | mean step (all steps), median (worst) of blocks, s | vs none | mean step without a save, "
          "median (worst), s | vs none | mean CPU time per step (thread), median (worst), s | vs none | "
          "mean CPU time of a step without a save, median (worst), s | vs none | save stall, median s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in ("none", "persist"):
        med = {m: statistics.median(x[m] for x in res[k]) for m in ms + ("stall",)}
        worst = {m: max(x[m] for x in res[k]) for m in ms}
        print("| %s | %s | %.3f |" % (k, " | ".join("%.4f (%.4f) | %+.1f%%" % (med[m], worst[m], 100 * (med[m] / base[m] - 1))
                                                  for m in ms), med["stall"]))


def paired(blocks, res):
    """Prints each measure's ratio persist / (the none blocks beside it):
    median, quartiles and a bootstrap 90% interval of the median."""
    kinds = [b["kind"] for b in blocks]
    idx = {"none": 0, "persist": 0}
    pos = []  # (kind, index into res[kind]) in block order
    for k in kinds:
        pos.append((k, idx[k]))
        idx[k] += 1
    names = {"mean": "mean step", "plain": "steps without a save", "cpu": "loop CPU per step",
             "cpuplain": "loop CPU, steps without a save"}
    rng = random.Random(1)
    for m, name in names.items():
        ratios = []
        for i, (k, j) in enumerate(pos):
            if k != "persist":
                continue
            near = [res["none"][pos[n][1]][m] for n in (i - 1, i + 1) if 0 <= n < len(pos) and pos[n][0] == "none"]
            if near:
                ratios.append(res["persist"][j][m] / statistics.mean(near))
        if len(ratios) < 2:
            return
        q = statistics.quantiles(ratios, n=4)
        boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        lo, hi = boot[int(0.05 * len(boot))], boot[int(0.95 * len(boot)) - 1]
        print("paired, %s: persist/none %+.1f%% median over %d pairs, quartiles %+.1f%% .. %+.1f%%, "
              "90%% interval of the median %+.1f%% .. %+.1f%%" % (
                  name, 100 * (statistics.median(ratios) - 1), len(ratios), 100 * (q[0] - 1), 100 * (q[2] - 1),
                  100 * (lo - 1), 100 * (hi - 1)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out")
    p.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--block-steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--mm", type=int, default=2)
    p.add_argument("--save-every", type=int, default=4)
    a = p.parse_args()
    (worker if a.worker else driver)(a)


if __name__ == "__main__":
    main()
