#!/usr/bin/python3
"""Soak benchmark: N restart cycles of one launcher, its footprint at the
start and at the end (docs/benchmarks.md, "Memory and footprint").

usage: go build -o /tmp/ft-launcher ./cmd/ft-launcher
       bench/soak.py [--ft-launcher /tmp/ft-launcher] [--restarts 20000] [--nproc 2] [--port 9499]

Every rank exits 1 at once, so every cycle ends in a restart
(--max-restarts N, --monitor-interval 0.01, --no-python /bin/sh worker).
The launcher's own metrics endpoint (--metrics-addr) is polled: RSS
(process_resident_memory_bytes), fds (process_open_fds), goroutines
(go_goroutines) and OS threads (go_threads), first once 10 restarts are done,
last just before the job ends. Prints a markdown table.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

WANT = ["ftlauncher_restarts_total", "process_resident_memory_bytes", "process_open_fds", "go_goroutines", "go_threads"]


def scrape(port):
    try:
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2).read().decode()
    except Exception:
        return None
    out = {}
    for line in body.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) == 2 and parts[0] in WANT:
            out[parts[0]] = float(parts[1])
    return out if "ftlauncher_restarts_total" in out else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    ap.add_argument("--restarts", type=int, default=20000)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--port", type=int, default=9499)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        worker = os.path.join(d, "fail.sh")
        with open(worker, "w") as f:
            f.write("#!/bin/sh\nexit 1\n")
        os.chmod(worker, 0o755)
        cmd = [a.ft_launcher, "--standalone", "--nproc-per-node", str(a.nproc), "--max-restarts", str(a.restarts),
               "--monitor-interval", "0.01", "--metrics-addr", "127.0.0.1:%d" % a.port,
               "--log-dir", os.path.join(d, "logs"), "--no-python", worker]
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first = last = None
        while p.poll() is None:
            s = scrape(a.port)
            if s:
                if first is None and s["ftlauncher_restarts_total"] >= 10:
                    first = s
                last = s
                print("\r%d restarts" % s["ftlauncher_restarts_total"], end="", file=sys.stderr)
            time.sleep(0.02 if first is None else 0.2)
        took = time.time() - t0
    print(file=sys.stderr)
    if first is None or last is None:
        sys.exit("no metrics sample (exit %s)" % p.returncode)
    print("%d restarts in %.0f s (%.1f ms/cycle), launcher exit %d" % (
        last["ftlauncher_restarts_total"], took, 1000 * took / max(last["ftlauncher_restarts_total"], 1), p.returncode))
    print()
    print("| | restarts | RSS (MB) | fds | goroutines | threads |")
    print("|---|---|---|---|---|---|")
    for name, s in (("start", first), ("end", last)):
        print("| %s | %d | %.1f | %d | %d | %d |" % (name, s["ftlauncher_restarts_total"],
              s["process_resident_memory_bytes"] / 1e6, s["process_open_fds"], s["go_goroutines"], s["go_threads"]))


if __name__ == "__main__":
    main()
