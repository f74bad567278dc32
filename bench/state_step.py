#!/usr/bin/python3
"""Step time of a training loop with launcher-held saves written out in the
background, against the same loop without checkpoints (docs/benchmarks.md,
"Issue 30: save and restore speed").

As a driver (the default) it runs, under the real ft-launcher, one rank of
this file in worker mode for each configuration, interleaved --reps times:
  none     no checkpoints
  memory   state.save every --save-every steps, --state-persist-every 0
           (written out only at the end: the save stall alone)
  persist  state.save every --save-every steps, --state-persist-every 1
           (every save written to --state-dir by the launcher's background
           writer while the loop trains on)
and prints, per configuration, the median and worst over runs of the mean
step time (all steps, save stalls included) and of the median time of the
steps without a save (what the background writer's disk and CPU use costs
the loop; the median, as preemptions on a shared machine hit single
steps), each against "none".

A step: --mm matrix products of 512x512 plus an optimizer-like pass over the
whole state (every tensor t += 1e-6), one thread.

    go build -o /tmp/ft-launcher ./cmd/ft-launcher
    /usr/bin/python3 bench/state_step.py --ft-launcher /tmp/ft-launcher --mib 256 --steps 40 --save-every 10 --reps 2
"""
import argparse
import json
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
    steps, saves = [], []
    for step in range(a.steps):
        t = time.perf_counter()
        for _ in range(a.mm):
            x = torch.tanh(x @ x / 512.0)
        with torch.no_grad():
            for v in st.values():
                v.add_(1e-6)
        saved = a.save_every > 0 and (step + 1) % a.save_every == 0
        if saved:
            s = time.perf_counter()
            state.save(step, st)
            saves.append(time.perf_counter() - s)
        steps.append((time.perf_counter() - t, saved))
    with open(a.out, "w") as f:
        json.dump({"steps": steps, "saves": saves}, f)


def driver(a):
    tmp = tempfile.mkdtemp(prefix="ftstate-step-", dir="/var/tmp")
    load0 = os.getloadavg()[0]
    t0 = time.time()
    kinds = [k for k in ("none", "memory", "persist") if k in a.kinds.split(",")]
    res = {k: [] for k in kinds}
    try:
        for rep in range(a.reps):
            for k in kinds:
                out = os.path.join(tmp, "%s-%d.json" % (k, rep))
                cmd = [a.ft_launcher, "--standalone", "--nproc-per-node", "1"]
                if k != "none":
                    sdir = os.path.join(tmp, "state-%s-%d" % (k, rep))
                    cmd += ["--state-dir", sdir, "--state-persist-every", "1" if k == "persist" else "0"]
                cmd += [os.path.abspath(__file__), "--worker", "--out", out, "--mib", str(a.mib), "--steps", str(a.steps),
                        "--mm", str(a.mm), "--save-every", "0" if k == "none" else str(a.save_every)]
                env = dict(os.environ, PYTHON_EXEC=sys.executable)
                p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
                if p.returncode != 0:
                    sys.exit("%s run %d failed (exit %d):\n%s" % (k, rep, p.returncode, p.stdout.decode()[-3000:]))
                with open(out) as f:
                    r = json.load(f)
                if k == "persist":  # the writer wrote at least one save while training
                    events = sum(1 for n in os.listdir(sdir) if n.endswith(".ftstate"))
                    assert events >= 1, os.listdir(sdir)
                    shutil.rmtree(sdir)
                st = [d for d, _ in r["steps"][a.skip:]]
                plain = [d for d, s in r["steps"][a.skip:] if not s]
                res[k].append({"mean": statistics.mean(st), "plain": statistics.median(plain),
                               "stall": statistics.median(r["saves"]) if r["saves"] else 0.0})
                print("  %s run %d: mean step %.4f s, median step without a save %.4f s" % (k, rep, res[k][-1]["mean"], res[k][-1]["plain"]),
                      file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d MiB state, %d steps (first %d skipped), a save every %d steps, %d runs each, interleaved; "
          "load average %.1f at start, %.1f at end, %.0f s" % (a.mib, a.steps, a.skip, a.save_every, a.reps, load0,
                                                              os.getloadavg()[0], time.time() - t0))
    base = {m: statistics.median(x[m] for x in res["none"]) for m in ("mean", "plain")} if "none" in res else None
    print("| run | mean step (all steps), median (worst) of runs, s | vs none | median step without a save, median (worst) of runs, s | vs none | save stall, median s |")
    print("|---|---|---|---|---|---|")
    for k in kinds:
        med = {m: statistics.median(x[m] for x in res[k]) for m in ("mean", "plain", "stall")}
        worst = {m: max(x[m] for x in res[k]) for m in ("mean", "plain")}
        rel = (lambda m: "%+.1f%%" % (100 * (med[m] / base[m] - 1))) if base else (lambda m: "")
        print("| %s | %.4f (%.4f) | %s | %.4f (%.4f) | %s | %.3f |" % (k, med["mean"], worst["mean"], rel("mean"),
                                                                   med["plain"], worst["plain"], rel("plain"), med["stall"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out")
    p.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=5, help="first steps left out (warm-up)")
    p.add_argument("--mm", type=int, default=2)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--kinds", default="none,memory,persist")
    a = p.parse_args()
    (worker if a.worker else driver)(a)


if __name__ == "__main__":
    main()
