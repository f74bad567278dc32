"""Measures the per-call cost of the Python client against a live monitor.

Run by the Go test TestPythonClientBench (monitor package) with
FT_RANK_MONITOR_IPC_SOCKET set; prints one JSON line with p50/p99 in µs.
"""

import json
import sys
import time

from ft_launcher_client import RankMonitorClient


def percentiles(samples):
    samples.sort()
    n = len(samples)
    return samples[n // 2] / 1000.0, samples[min(n - 1, (n * 99) // 100)] / 1000.0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    c = RankMonitorClient()
    c.init_workload_monitoring()
    clock = time.perf_counter_ns
    hb = []
    for _ in range(n):
        t0 = clock()
        c.send_heartbeat()
        hb.append(clock() - t0)
    sec = []
    for i in range(n):
        t0 = clock()
        c.start_section("step")
        c.end_section("step")
        sec.append(clock() - t0)
    ring = c.section_ring
    c.shutdown_workload_monitoring()
    hb50, hb99 = percentiles(hb)
    s50, s99 = percentiles(sec)
    print(json.dumps({"n": n, "heartbeat_p50_us": hb50, "heartbeat_p99_us": hb99,
                      "section_open_close_p50_us": s50, "section_open_close_p99_us": s99,
                      "section_ring": ring}))


if __name__ == "__main__":
    main()
