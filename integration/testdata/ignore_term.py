#!/usr/bin/python3
"""Ignore SIGTERM and keep running, so only SIGKILL stops it.

usage: ignore_term.py [READY_FILE]
After the handler is installed, writes its pid to READY_FILE (atomically).
Each SIGTERM received appends "SIGTERM <pid>" to READY_FILE.terms, so a test
can check that a graceful signal was sent before the kill.
"""
import os
import signal
import sys
import time


def main():
    ready = sys.argv[1] if len(sys.argv) > 1 else None

    def on_term(signum, frame):
        if ready:
            with open(ready + ".terms", "a") as f:
                f.write(f"SIGTERM {os.getpid()}\n")

    signal.signal(signal.SIGTERM, on_term)
    if ready:
        tmp = f"{ready}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, ready)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
