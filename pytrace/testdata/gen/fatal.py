"""Crash with a fatal signal while a second thread waits, faulthandler enabled.

usage: python fatal.py segv|abort|fpe|bus [torch]
"""
import faulthandler
import os
import signal
import sys
import threading


def worker(ev):
    ev.wait()


def crash(mode):
    if mode == "segv":
        import ctypes
        ctypes.string_at(0)
    elif mode == "abort":
        os.abort()
    elif mode == "fpe":
        os.kill(os.getpid(), signal.SIGFPE)
    elif mode == "bus":
        os.kill(os.getpid(), signal.SIGBUS)


def main():
    ev = threading.Event()
    t = threading.Thread(target=worker, args=(ev,), name="worker", daemon=True)
    t.start()
    crash(sys.argv[1])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "torch":
        import torch  # noqa: F401  (loads extension modules)
    faulthandler.enable(all_threads=True)
    main()
