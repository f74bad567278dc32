#!/usr/bin/python3
"""A rank with the slow phases a first run has, for the default clocks.

usage: slow_phases_worker.py [--sections] [--first-step S] [--save S] [--hang-rank R]

Connects with ft-launcher's Python client (RankMonitorClient), heartbeats
once, then: a first step of S seconds (default 30), 15 steps of 50 ms, a
save of S seconds (default 20), 15 more steps, and exits 0. Every slow
phase sleeps (the rank is idle, as one waiting on storage or a peer), so
only the clocks' rules spare it, not the activity check. With --sections
the save is a "checkpointing" section, as ctx.state.save announces it;
without, the client only heartbeats. With --hang-rank R, rank R stops
heartbeating after the last step, in round 0, and sleeps. Standard library
only.
"""
import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

from ft_launcher_client import RankMonitorClient  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sections", action="store_true")
    p.add_argument("--first-step", type=float, default=30)
    p.add_argument("--save", type=float, default=20)
    p.add_argument("--hang-rank", type=int, default=-1)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    cycle = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    client = RankMonitorClient()
    client.init_workload_monitoring()

    def steps(n):
        for _ in range(n):
            time.sleep(0.05)
            client.send_heartbeat()

    client.send_heartbeat()
    time.sleep(a.first_step)  # the first step: compilation, first collectives
    client.send_heartbeat()
    steps(15)
    if a.sections:
        client.start_section("checkpointing")
    time.sleep(a.save)
    if a.sections:
        client.end_section("checkpointing")
    client.send_heartbeat()
    steps(15)
    if rank == a.hang_rank and cycle == 0:
        print("rank %d hangs" % rank, flush=True)
        time.sleep(3600)
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
