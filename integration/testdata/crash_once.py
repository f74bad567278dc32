#!/usr/bin/python3
"""Fail once, then succeed: the smallest restart scenario.

usage: crash_once.py STATE_DIR [--rank R] [--exit-code N] [--delay S] [--wait S]
Every start appends "<cycle> <rank> <pid>" to STATE_DIR/starts.log.
In restart cycle 0 (TORCHELASTIC_RESTART_COUNT unset or 0), global rank R
(default 0) sleeps --delay seconds (default 0.2), creates STATE_DIR/crashed
and exits with --exit-code (default 1); the other ranks sleep --wait seconds
(default 60) so the launcher has to stop them. If STATE_DIR/crashed already
exists, or in any later cycle, every rank exits 0 at once.
"""
import argparse
import os
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("state_dir")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--delay", type=float, default=0.2)
    p.add_argument("--wait", type=float, default=60.0)
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0")
    with open(os.path.join(a.state_dir, "starts.log"), "a") as f:
        f.write(f"{cycle} {rank} {os.getpid()}\n")
    marker = os.path.join(a.state_dir, "crashed")
    if cycle != 0 or os.path.exists(marker):
        return 0
    if rank == a.rank:
        time.sleep(a.delay)
        open(marker, "w").close()
        return a.exit_code
    time.sleep(a.wait)
    return 0


if __name__ == "__main__":
    sys.exit(main())
