#!/usr/bin/python3
"""A rank instrumented with ft-launcher's Python client, for hang tests.

usage: monitored_worker.py MODE [--rank R] [--beats N] [--interval S] [--socket]

Every rank sends N heartbeats (default 5), each inside a "step" section,
S seconds apart (default 0.05), and exits 0. In restart cycle 0 the rank R
(default 1) then misbehaves according to MODE, so that only its rank
monitor can end it:
  no-first-heartbeat  connects and never heartbeats
  heartbeat-stops     stops heartbeating (no section open)
  section             stays inside the "step" section
  out-of-section      stays outside any section
  sigstop             stops itself with SIGSTOP
  ignore-term         ignores SIGTERM, then stops heartbeating
  fine                does not misbehave
--socket sends heartbeats and sections over the socket instead of the
shared-memory region. Standard library only: no torch needed.
"""
import argparse
import os
import signal
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

from ft_launcher_client import RankMonitorClient  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--beats", type=int, default=5)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--socket", action="store_true")
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    cycle = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    bad = cycle == 0 and rank == a.rank and a.mode != "fine"
    client = RankMonitorClient()
    if a.socket:
        client.use_shared_memory = False
    client.init_workload_monitoring()
    if bad and a.mode == "no-first-heartbeat":
        time.sleep(3600)
    if bad and a.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for _ in range(a.beats):
        client.start_section("step")
        client.send_heartbeat()
        time.sleep(a.interval)
        client.end_section("step")
    if bad:
        if a.mode == "section":
            client.start_section("step")
        elif a.mode == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    sys.exit(main())
