#!/usr/bin/python3
"""Heartbeat through the ft-launcher rank monitor client, then maybe hang.

usage: heartbeat_worker.py [--beats N] [--interval S] [--hang-rank R] [--section NAME]
Sends N heartbeats (default 5) every S seconds (default 0.1), each inside
section NAME (default "step"). In restart cycle 0 the rank R (default -1:
none) then stops heartbeating and sleeps forever inside an open section, so
only the rank monitor's timeout can end it. Everyone else exits 0. Exits 3 if
FT_RANK_MONITOR_IPC_SOCKET is unset or the client cannot be imported (no torch
needed; the client lives in ../../client/python).
"""
import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--beats", type=int, default=5)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--section", default="step")
    a = p.parse_args()
    if not os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
        print("heartbeat_worker: FT_RANK_MONITOR_IPC_SOCKET is not set", file=sys.stderr)
        return 3
    try:
        from ft_launcher_client import RankMonitorClient
    except ImportError as e:
        print(f"heartbeat_worker: cannot import ft_launcher_client: {e}", file=sys.stderr)
        return 3
    rank = int(os.environ.get("RANK", "0"))
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    for _ in range(a.beats):
        client.start_section(a.section)
        client.send_heartbeat()
        time.sleep(a.interval)
        client.end_section(a.section)
    if cycle == 0 and rank == a.hang_rank:
        client.start_section(a.section)
        while True:
            time.sleep(3600)
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
