#!/usr/bin/python3
"""A training-like rank for the verdict's progress and rank_failures.

usage: progress_worker.py CRASH_RANK CRASH_STEP MARKER_DIR

Every rank opens one "step" section per iteration (carrying the iteration,
and a heartbeat inside it) and a "checkpointing" section after iteration 4.
The other ranks run 10 iterations and then wait, stopped by the launcher;
rank CRASH_RANK waits until they have, opens the step of iteration
CRASH_STEP and exits with code 3 inside it: its failure comes at a known
step in every cycle. Standard library only: no torch needed.
"""
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

from ft_launcher_client import RankMonitorClient  # noqa: E402


def main():
    crash_rank, crash_step, marker_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    cycle = os.environ["TORCHELASTIC_RESTART_COUNT"]
    c = RankMonitorClient()
    c.init_workload_monitoring()
    n = crash_step + 1 if rank == crash_rank else 10
    for it in range(n):
        c.start_section("step", iteration=it)
        c.send_heartbeat()
        if rank == crash_rank and it == crash_step:
            # Every other rank has done its steps: the counts are exact.
            deadline = time.monotonic() + 60
            while len([f for f in os.listdir(marker_dir) if f.startswith(cycle + ".")]) < world - 1:
                if time.monotonic() > deadline:
                    sys.exit("the other ranks did not finish their steps")
                time.sleep(0.02)
            os._exit(3)
        time.sleep(0.01)
        c.end_section("step")
        if it == 4:
            c.start_section("checkpointing")
            time.sleep(0.05)
            c.end_section("checkpointing")
    open(os.path.join(marker_dir, "%s.%d" % (cycle, rank)), "w").close()
    time.sleep(300)


if __name__ == "__main__":
    main()
