"""Other faulthandler outputs.

usage: python misc_dumps.py stack|later|fatalerror
  stack:      faulthandler.dump_traceback(all_threads=False) -> "Stack (most recent call first):"
  later:      faulthandler.dump_traceback_later(0.5) while the main thread sleeps -> "Timeout (0:00:00.500000)!"
  fatalerror: Py_FatalError("...") via ctypes, with a second thread
  many:       dump_traceback(all_threads=True) with 104 threads (faulthandler stops after 100: "...")
"""
import ctypes
import faulthandler
import sys
import threading
import time


def worker(ev):
    ev.wait()


def leaf(mode):
    if mode == "stack":
        faulthandler.dump_traceback(all_threads=False)
    elif mode == "later":
        faulthandler.dump_traceback_later(0.5, exit=False)
        time.sleep(1.5)
    elif mode == "fatalerror":
        ctypes.pythonapi.Py_FatalError(b"checkpoint writer: inconsistent state")
    elif mode == "many":
        ev = threading.Event()
        ts = [threading.Thread(target=worker, args=(ev,), daemon=True) for _ in range(103)]
        for t in ts:
            t.start()
        faulthandler.dump_traceback(all_threads=True)
        ev.set()


def main(mode):
    ev = threading.Event()
    t = threading.Thread(target=worker, args=(ev,), name="worker", daemon=True)
    t.start()
    leaf(mode)
    ev.set()


if __name__ == "__main__":
    faulthandler.enable()
    main(sys.argv[1])
