#!/usr/bin/python3
"""A/B of the state copy's threads in one process (docs/benchmarks-history.md,
"Parallel and overlapped save"): state.save, state.load(into=...)
and state.load() of one --mib MiB state (float32 tensors of 16 MiB) with
FT_STATE_COPY_THREADS=1 (the single-thread path: the slot mapped with
MAP_POPULATE), =N with the slot mapped with MAP_POPULATE, and =N with each
copy thread filling its own range's page tables (MADV_POPULATE_READ, and
MADV_POPULATE_WRITE for a new tensor's pages; the default). The variants
alternate within each round; medians over --reps rounds.

    /usr/bin/python3 bench/state_threads_ab.py --mib 256 --reps 7 --threads 2
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
from ft_launcher_client import state  # noqa: E402
from ft_launcher_client.state import segment  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    shm = tempfile.mkdtemp(prefix="ftstate-ab-", dir="/dev/shm")
    os.environ[state.SHM_DIR_ENV] = shm
    load0, t0 = os.getloadavg()[0], time.time()
    try:
        st = {"model": {"w%d" % i: torch.randn(4 << 20) for i in range(a.mib // 16)}}
        dst = {"model": {k: torch.zeros_like(v) for k, v in st["model"].items()}}
        for _ in range(3):  # both slots mapped in
            state.save(0, st)
        variants = [("1 thread", "1", "threads"), ("%d threads, MAP_POPULATE" % a.threads, str(a.threads), "map"),
                    ("%d threads, populate per thread" % a.threads, str(a.threads), "threads")]
        ops = [("save", lambda: state.save(1, st)), ("load(into=)", lambda: state.load(into=dst)),
               ("load() new tensors", lambda: state.load())]
        res = {}
        for _ in range(a.reps):
            for vname, n, mode in variants:
                os.environ[state.COPY_THREADS_ENV] = n
                segment.LOAD_POPULATE = mode
                for oname, f in ops:
                    t = time.perf_counter()
                    f()
                    res.setdefault((oname, vname), []).append(time.perf_counter() - t)
            t = time.perf_counter()
            for d, s in zip(dst["model"].values(), st["model"].values()):
                d.copy_(s)
            res.setdefault(("copy_ (one thread)", ""), []).append(time.perf_counter() - t)
    finally:
        shutil.rmtree(shm)
    print("%d MiB, %d rounds, %d CPUs; load average %.1f at start, %.1f at end, %.0f s"
          % (a.mib, a.reps, len(os.sched_getaffinity(0)), load0, os.getloadavg()[0], time.time() - t0))
    for (o, v), xs in res.items():
        print("  %-20s %-34s median %.3f s  (min %.3f, max %.3f)" % (o, v, statistics.median(xs), min(xs), max(xs)))


if __name__ == "__main__":
    main()
