#!/usr/bin/python3
"""Save stall and restore time of ft_launcher_client.state (docs/state.md,
docs/benchmarks.md "State save and restore").

For one state of --mib MiB per rank (float32 tensors of 16 MiB each) it
measures, in one run, --reps rounds of:
  copy            a plain memory copy of the state into preallocated tensors,
                  with torch's copy_ and with glibc's memcpy (ctypes.memmove;
                  faster for large copies: non-temporal stores); the ratios
                  printed are against the faster of the two
  save            state.save into a launcher segment in /dev/shm (the
                  training loop's stall), with checksum=False and with
                  checksum=True (the default since the CRC is computed on
                  the copy threads); with the copy split across N threads
                  (FT_STATE_COPY_THREADS: --threads, default auto: CPUs /
                  ranks, at most 8) and with 1 thread
  overlap         a fixed compute (--matmuls products of two 512x512
                  float32 matrices) alone; after a save; and with
                  save(overlap=True) before it and wait() after it: the
                  stall is the call plus the wait, and the compute's own
                  time shows what the background copy takes from it
  pwrite          the state written with pwrite into a tmpfs file whose
                  pages exist (the save's write path before it kept the
                  segment mapped)
  torch.save      to a file on local disk (--disk-dir) plus fsync
  load            state.load from the segment into new tensors
  load into       state.load(into=...) into the caller's existing tensors,
                  without and with the CRC checked; N threads and 1
  torch.load      of the file torch.save wrote, from the page cache and
                  from disk (its pages dropped with POSIX_FADV_DONTNEED
                  first), and from disk followed by the copy into the
                  model's tensors (load_state_dict's part)
The methods are interleaved within each round, so that the load of a shared
machine falls on all alike; each "1 thread" case and its N-thread twin swap
places every other round. With --ranks N, N processes (each its own local
rank, segment and file) run every case at once after a barrier; a round's
time is the slowest rank's (what a synchronous data-parallel job waits for).
Prints the median and the worst round of each, and the first two saves of a
fresh segment (which fault its pages in).

    /usr/bin/python3 bench/state_bench.py --mib 256 --reps 7
    /usr/bin/python3 bench/state_bench.py --mib 256 --reps 3 --ranks 4 --no-crc
    /usr/bin/python3 bench/state_bench.py --mib 256 --reps 3 --threads 2
"""
import argparse
import ctypes
import multiprocessing as mp
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
from ft_launcher_client.state import copying  # noqa: E402


def rank_main(rank, a, shm, disk, barrier, out):
    torch.set_num_threads(1)
    os.environ.update({state.SHM_DIR_ENV: shm, "LOCAL_RANK": str(rank), "RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(a.ranks), state.DIR_ENV: os.path.join(disk, "files"),
                       state.COPY_THREADS_ENV: str(a.threads or "auto")})
    nthreads = state.copy_threads()

    def one(f):
        """f with the copy in one thread (the path before the parallel copy)."""
        def g():
            os.environ[state.COPY_THREADS_ENV] = "1"
            try:
                return f()
            finally:
                os.environ[state.COPY_THREADS_ENV] = str(a.threads or "auto")
        return g

    ma, mb = torch.randn(512, 512), torch.randn(512, 512)

    def compute():
        for _ in range(a.matmuls):
            torch.mm(ma, mb)

    ov = {}

    def save_then_compute():
        t = time.perf_counter()
        state.save(1, st, checksum=False)
        ov["stall"] = time.perf_counter() - t
        t = time.perf_counter()
        compute()
        ov["compute"] = time.perf_counter() - t

    def overlapped():
        t = time.perf_counter()
        state.save(1, st, checksum=False, overlap=True)
        call = time.perf_counter() - t
        t = time.perf_counter()
        compute()
        ov["compute"] = time.perf_counter() - t
        w = state.wait()
        assert w["committed"], w
        ov["stall"] = call + w["wait_seconds"]
    n = a.mib // 16
    torch.manual_seed(rank)
    st = {"model": {"w%d" % i: torch.randn(4 << 20) for i in range(n)}, "step": 0}
    dst = {"model": {k: torch.empty_like(v) for k, v in st["model"].items()}}
    for d in dst["model"].values():
        d.zero_()  # touched, as a model's parameters are
    path = os.path.join(disk, "ckpt-%d.pt" % rank)

    def copy():
        for d, s in zip(dst["model"].values(), st["model"].values()):
            d.copy_(s)

    def memcpy():
        for d, s in zip(dst["model"].values(), st["model"].values()):
            ctypes.memmove(d.data_ptr(), s.data_ptr(), s.numel() * s.element_size())

    # The save's old write path, for comparison: pwrite of each tensor into
    # a tmpfs file whose pages exist (what state.save did before it kept
    # its segment mapped).
    raw = os.open(os.path.join(shm, "pwrite-%d" % rank), os.O_RDWR | os.O_CREAT, 0o600)

    def raw_pwrite():
        off = 0
        for v in st["model"].values():
            b = copying.cpu_view(v)
            os.pwrite(raw, b, off)
            off += len(b)

    raw_pwrite()

    def tsave():
        with open(path, "wb") as f:
            torch.save(st, f)
            f.flush()
            os.fsync(f.fileno())

    def drop():
        # Only this file's pages leave the page cache: a read from disk.
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    def cold_load():
        drop()
        torch.load(path)

    def cold_load_copy():
        drop()
        got = torch.load(path)
        for k, d in dst["model"].items():
            d.copy_(got["model"][k])

    barrier.wait()
    first = []
    for _ in range(2):  # a fresh segment: both slots' pages are faulted in
        t = time.perf_counter()
        state.save(0, st, checksum=False)
        first.append(time.perf_counter() - t)
    tsave()
    cases = [
        ("copy (torch copy_)", copy, None),
        ("memcpy (glibc, ctypes)", memcpy, None),
        ("save", lambda: state.save(1, st, checksum=False), None),
        ("save (1 thread)", one(lambda: state.save(1, st, checksum=False)), None),
        ("pwrite into tmpfs (old save)", raw_pwrite, None),
        ("save (checksum=True)", lambda: state.save(1, st, checksum=True), None),
        ("torch.save+fsync", tsave, None),
        ("load (new tensors)", lambda: state.load(), lambda: state.save(1, st, checksum=False)),
        ("load (new, 1 thread)", one(lambda: state.load()), lambda: state.save(1, st, checksum=False)),
        ("load (into=)", lambda: state.load(into=dst), None),
        ("load (into=, 1 thread)", one(lambda: state.load(into=dst)), None),
        ("load (into=, CRC checked)", lambda: state.load(into=dst), lambda: state.save(1, st, checksum=True)),
        ("torch.load (page cache)", lambda: torch.load(path), None),
        ("torch.load (from disk)", cold_load, None),
        ("torch.load (disk) + copy", cold_load_copy, None),
        ("compute alone", compute, None),
        ("save, then compute", save_then_compute, None),
        ("overlapped save + compute", overlapped, None),
    ]
    if a.no_crc:
        cases = [c for c in cases if "checksum" not in c[0] and "CRC" not in c[0]]
    times = {name: [] for name, _, _ in cases}
    for r in range(a.reps):
        order = list(cases)
        if r % 2:
            # Each "1 thread" case runs before its N-thread twin in every
            # other round: what the case before leaves behind (the page
            # cache torch.save filled, memory just freed) falls on both.
            for i in range(1, len(order)):
                if order[i][0].endswith("1 thread)"):
                    order[i - 1], order[i] = order[i], order[i - 1]
        for name, f, setup in order:
            if setup:
                setup()
            barrier.wait()
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
            if name in ("save, then compute", "overlapped save + compute"):
                times.setdefault(name + ": stall", []).append(ov["stall"])
                times.setdefault(name + ": compute", []).append(ov["compute"])
    state.save(2, st)
    got = state.load(into=dst)[1]
    assert all(torch.equal(got["model"][k], v) and got["model"][k] is dst["model"][k] for k, v in st["model"].items())
    os.close(raw)
    out.put((rank, first, times, nthreads))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--disk-dir", default="/var/tmp")
    p.add_argument("--no-crc", action="store_true", help="leave out the cases with a CRC (a shorter run)")
    p.add_argument("--threads", type=int, default=0, help="copy threads per rank (FT_STATE_COPY_THREADS); 0: auto")
    p.add_argument("--matmuls", type=int, default=4, help="512x512 products in the overlap cases' compute")
    a = p.parse_args()
    shm = tempfile.mkdtemp(prefix="ftstate-bench-", dir="/dev/shm")
    disk = tempfile.mkdtemp(prefix="ftstate-bench-", dir=a.disk_dir)
    load0 = os.getloadavg()[0]
    t0 = time.time()
    try:
        ctx = mp.get_context("fork")
        barrier, out = ctx.Barrier(a.ranks), ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, a, shm, disk, barrier, out)) for r in range(a.ranks)]
        for pr in procs:
            pr.start()
        res = [out.get(timeout=600) for _ in procs]
        for pr in procs:
            pr.join()
            if pr.exitcode != 0:
                sys.exit("rank process failed: exit %s" % pr.exitcode)
    finally:
        shutil.rmtree(shm)
        shutil.rmtree(disk)
    # A round's time is its slowest rank's.
    names = list(res[0][2])
    rounds = {k: [max(r[2][k][i] for r in res) for i in range(a.reps)] for k in names}
    med = {k: statistics.median(v) for k, v in rounds.items()}
    base = min(med["copy (torch copy_)"], med["memcpy (glibc, ctypes)"])
    print("state %d MiB x %d rank(s), %d rounds, torch %s, torch 1 thread, state copy threads %d per rank (%d CPUs); "
          "load average %.1f at start, %.1f at end, %.0f s"
          % (a.mib, a.ranks, a.reps, torch.__version__, res[0][3], len(os.sched_getaffinity(0)), load0,
             os.getloadavg()[0], time.time() - t0))
    print("  first save into a fresh segment %.3f s, second (its other slot) %.3f s (slowest rank)"
          % (max(r[1][0] for r in res), max(r[1][1] for r in res)))
    print("  %-28s %9s %9s %9s" % ("", "median s", "worst s", "x copy"))
    for k in names:
        print("  %-28s %9.3f %9.3f %9.2f" % (k, med[k], max(rounds[k]), med[k] / base))
    print("  torch.save+fsync / save:                 %.1fx" % (med["torch.save+fsync"] / med["save"]))
    print("  torch.save+fsync / overlapped stall:     %.1fx" % (med["torch.save+fsync"] / med["overlapped save + compute: stall"]))
    print("  overlapped stall / copy:                 %.2fx; compute slowed by the overlap: %+.0f%%"
          % (med["overlapped save + compute: stall"] / base,
             100 * (med["overlapped save + compute: compute"] / med["compute alone"] - 1)))
    print("  save (1 thread) / save:                  %.2fx; load (into=, 1 thread) / load (into=): %.2fx"
          % (med["save (1 thread)"] / med["save"], med["load (into=, 1 thread)"] / med["load (into=)"]))
    for k in ("torch.load (page cache)", "torch.load (from disk)", "torch.load (disk) + copy"):
        print("  %-28s / load (into=): %.1fx" % (k, med[k] / med["load (into=)"]))


if __name__ == "__main__":
    main()
