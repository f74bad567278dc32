#!/usr/bin/python3
"""Restore time of a peer heal against a restore from launcher memory
(docs/state.md "Peer heal", docs/benchmarks.md "In-process restarts and peer heal").

Two real ranks (processes) in a gloo process group on loopback, a state of
--mib MiB (float32 tensors of 16 MiB each). Rank 1 first saves the state
into a launcher segment in /dev/shm (as its launcher would hold it). Then,
--reps times each, median:
  memory   rank 1's state.load() from the segment (a restore after a
           restart from launcher memory)
  heal     ft_launcher_client.heal.heal: rank 0 (the survivor) passes its
           live state, rank 1 (the replacement) None; both agree on the
           step through the group's TCPStore, rank 0 encodes the state and
           sends it over gloo, rank 1 decodes it (the time on rank 1, from
           the call to its state in hand; and rank 0's)
The state received is checked bit-identical once.

    /usr/bin/python3 bench/peerheal_bench.py --mib 256 --reps 5
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))


def rank_main(a):
    import torch
    import torch.distributed as dist

    from ft_launcher_client import heal, state

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method="env://")
    n = a.mib // 16
    g = torch.Generator().manual_seed(7)
    st = {"model": {"w%d" % i: torch.randn(4 << 20, generator=g) for i in range(n)}, "step": 11}
    out = {"memory": [], "heal": [], "heal_sender": []}
    if rank == 1:
        state.save(11, st)
        state.save(11, st)  # both slots touched, as in a long run
        for _ in range(a.reps):
            t = time.perf_counter()
            step, got = state.load()
            out["memory"].append(time.perf_counter() - t)
            assert step == 11
            del got
    dist.barrier()
    for i in range(a.reps):
        dist.barrier()
        t = time.perf_counter()
        step, got = heal.heal(11 if rank == 0 else None, st if rank == 0 else None)
        dt = time.perf_counter() - t
        out["heal" if rank == 1 else "heal_sender"].append(dt)
        if rank == 1 and i == 0:
            for k, v in st["model"].items():
                assert v.view(-1).view(torch.uint8).equal(got["model"][k].view(-1).view(torch.uint8)), k
        del got
    with open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank_main:
        return rank_main(a)
    shm = tempfile.mkdtemp(prefix="ftheal-bench-", dir="/dev/shm")
    out = tempfile.mkdtemp(prefix="ftheal-bench-out-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-main", "--mib", str(a.mib),
                                   "--reps", str(a.reps), "--out", out],
                                  env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FT_STATE_SHM_DIR=shm,
                                           FT_STATE_DIR=os.path.join(out, "files"), TORCHELASTIC_RESTART_COUNT="1"))
                 for r in range(2)]
        for pr in procs:
            if pr.wait(timeout=600) != 0:
                raise SystemExit("a rank failed")
        res = {}
        for r in range(2):
            with open(os.path.join(out, "rank-%d.json" % r)) as f:
                for k, v in json.load(f).items():
                    res.setdefault(k, []).extend(v)
        med = {k: statistics.median(v) for k, v in res.items() if v}
        print("state %d MiB, 2 gloo ranks on loopback, median of %d" % (a.mib, a.reps))
        print("  restore from launcher memory (load)     %8.3f s" % med["memory"])
        print("  peer heal, on the replacement           %8.3f s  (%.0f MiB/s)" % (med["heal"], a.mib / med["heal"]))
        print("  peer heal, on the survivor (sender)     %8.3f s" % med["heal_sender"])
        print("  heal / memory                           %8.2f x" % (med["heal"] / med["memory"]))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
