#!/usr/bin/python3
"""A torch rank (gloo) that hangs in a chosen way, for the culprit tests.

usage: hang_kinds_worker.py KINDS [--steps N] [--hang-step S]

KINDS is a comma-separated list; in restart round r < len(KINDS) the rank
CULPRITS[r % 4] of the job (scaled to worlds larger than 4) hangs at step S (default 20) in the way
KINDS[r] names, while the others wait for it in the step's all_reduce:
  lock        deadlocks on a threading.Lock
  fifo        reads a FIFO no one writes
  stop        stops itself with SIGSTOP
  collective  enters an all_reduce of a two-rank group whose other rank
              never joins it
Later rounds run N steps (default 40) and exit 0. Every step heartbeats.
The culprit of each round is printed as "culprit R KIND" to stderr.

With FTL_FAKE_FLIGHT_RECORDER=1 torch's _dump_nccl_trace is stood in for
(this torch has no NCCL, this machine no GPU): it returns a pickle shaped
as torch's, whose entries are this rank's all_reduces, the one it is in
"started" and the ones before "completed".
"""
import argparse
import os
import signal
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ft_launcher_client import RankMonitorClient  # noqa: E402

CULPRITS = [1, 2, 3, 0]
_reduces = []  # [seq, state] of each all_reduce on the default group, for the fake flight recorder


def fake_flight_recorder():
    import pickle
    import torch._C._distributed_c10d as c10d

    def dump(includeCollectives=None, includeStackTraces=None, onlyActive=None):
        entries = [{"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                    "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "nccl:all_reduce", "state": state,
                    "input_sizes": [[1024]], "time_created_ns": i} for i, (seq, state) in enumerate(_reduces)]
        return pickle.dumps({"version": "2.4", "pg_config": {}, "entries": entries})
    c10d._dump_nccl_trace = dump


def all_reduce(t):
    if _reduces:
        _reduces[-1][1] = "completed"
    _reduces.append([len(_reduces) + 1, "started"])
    dist.all_reduce(t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kinds")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hang-step", type=int, default=20)
    a = p.parse_args()
    kinds = a.kinds.split(",")
    rnd = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    if os.environ.get("FTL_FAKE_FLIGHT_RECORDER") == "1":
        fake_flight_recorder()
    kind = kinds[rnd] if rnd < len(kinds) else None
    per = max(world // 4, 1)  # spread over every node when the world is larger than 4
    culprit = (CULPRITS[rnd % 4] * per + (rnd // 4) % per) % world
    partner = (culprit + 1) % world
    side = dist.new_group(sorted([culprit, partner]))  # every rank makes it; the partner never uses it
    c = RankMonitorClient()
    c.init_workload_monitoring()
    t = torch.ones(1024)
    lock = threading.Lock()
    if rank == culprit and kind:
        print("culprit %d %s" % (rank, kind), file=sys.stderr, flush=True)
    for i in range(a.steps):
        if kind and rank == culprit and i == a.hang_step:
            if kind == "lock":
                lock.acquire()
                lock.acquire()
            elif kind == "fifo":
                path = os.path.join(os.environ["OUT"], "fifo-%d" % rnd)
                os.mkfifo(path)
                os.read(os.open(path, os.O_RDWR), 1)
            elif kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif kind == "collective":
                dist.all_reduce(t, group=side)
        all_reduce(t)
        time.sleep(0.02)
        c.send_heartbeat()
    c.shutdown_workload_monitoring()


if __name__ == "__main__":
    main()
