#!/usr/bin/python3
"""Leave a SIGTERM-ignoring grandchild behind, in the worker's process group.

usage: fork_grandchild.py PID_FILE [--exit]
Forks a grandchild that ignores SIGTERM and sleeps forever, then writes
"<worker pid> <grandchild pid>" to PID_FILE (atomically). Without --exit the
worker sleeps forever too; with --exit it exits 1 at once, orphaning the
grandchild, so a launcher that only waits for its direct child leaks it.
"""
import os
import signal
import sys
import time


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    pid_file = sys.argv[1]
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    tmp = f"{pid_file}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {child}\n")
    os.replace(tmp, pid_file)
    if "--exit" in sys.argv[2:]:
        os._exit(1)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
