#!/usr/bin/python3
"""Save stall and restore time of ft_launcher_client.state (docs/state.md,
docs/benchmarks.md "Issue 30: launcher-held state").

For one state of --mib MiB (float32 tensors of 16 MiB each) it measures, in
one run, the median of --reps repetitions of:
  copy        a plain memory copy of the state into preallocated tensors
  save        state.save into a launcher segment in /dev/shm (the training
              loop's stall), without (the default) and with checksum=True
  torch.save  to a file on local disk (--disk-dir) plus fsync
  load        state.load from the segment (a memory copy into new tensors)
  torch.load  of the file torch.save wrote, from the page cache and from
              disk (its pages dropped with POSIX_FADV_DONTNEED first)

    /usr/bin/python3 bench/state_bench.py --mib 256 --reps 5
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--disk-dir", default="/var/tmp")
    a = p.parse_args()
    n = a.mib // 16
    st = {"model": {"w%d" % i: torch.randn(4 << 20) for i in range(n)}, "step": 0}
    dst = [torch.empty(4 << 20) for _ in range(n)]
    shm = tempfile.mkdtemp(prefix="ftstate-bench-", dir="/dev/shm")
    disk = tempfile.mkdtemp(prefix="ftstate-bench-", dir=a.disk_dir)
    os.environ.update({state.SHM_DIR_ENV: shm, "LOCAL_RANK": "0", "RANK": "0", state.DIR_ENV: disk})
    try:
        def copy():
            for d, s in zip(dst, st["model"].values()):
                d.copy_(s)

        state.save(0, st)  # creates the segment (first save)
        state.save(0, st)  # both slots touched: steady state from here
        path = os.path.join(disk, "ckpt.pt")

        def tsave():
            with open(path, "wb") as f:
                torch.save(st, f)
                f.flush()
                os.fsync(f.fileno())

        def cold_load():
            # Only this file's pages leave the page cache: a read from disk.
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            torch.load(path)

        # Interleaved (one of each per round), so that the load of a shared
        # machine falls on every method alike.
        cases = [
            ("copy", copy, None),
            ("save", lambda: state.save(1, st), None),
            ("save (checksum=True)", lambda: state.save(1, st, checksum=True), None),
            ("torch.save+fsync", tsave, None),
            ("load (memory)", lambda: state.load(), lambda: state.save(1, st)),
            ("load (memory, CRC checked)", lambda: state.load(), lambda: state.save(1, st, checksum=True)),
            ("torch.load (page cache)", lambda: torch.load(path), None),
            ("torch.load (from disk)", cold_load, None),
        ]
        times = {name: [] for name, _, _ in cases}
        for _ in range(a.reps):
            for name, f, setup in cases:
                if setup:
                    setup()
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
        res = {k: statistics.median(v) for k, v in times.items()}
        got = state.load()[1]
        assert all(torch.equal(got["model"][k], v) for k, v in st["model"].items())
        print("state %d MiB, %d reps, median seconds (torch %s, %d threads)" % (a.mib, a.reps, torch.__version__, torch.get_num_threads()))
        for k, v in res.items():
            print("  %-30s %8.3f s  %6.2fx copy" % (k, v, v / res["copy"]))
    finally:
        shutil.rmtree(shm)
        shutil.rmtree(disk)


if __name__ == "__main__":
    main()
