"""Start blocked.py, wait until it blocks, dump it with SIGRTMIN+3, kill it.

usage: python drive_blocked.py OUT_PREFIX PYTHON MODE [--twice]
(for gloo, starts both ranks and dumps both: OUT_PREFIX_rank0.txt / _rank1.txt)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_file(path, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return True
        time.sleep(0.1)
    return False


def start(python, mode, dump, tmp, extra=(), env_extra=None):
    ready = os.path.join(tmp, "ready-" + mode)
    env = dict(os.environ, DUMP_FILE=dump, READY_FILE=ready, PYTHONUNBUFFERED="1")
    env.update(env_extra or {})
    p = subprocess.Popen([python, os.path.join(HERE, "blocked.py"), mode] + list(extra), env=env)
    return p, ready


def dump_and_kill(procs, twice):
    for p, ready, dump in procs:
        if not wait_file(ready):
            raise SystemExit("not ready: %s" % ready)
    time.sleep(1.5)  # let it reach the blocking call
    for n in range(2 if twice else 1):
        for p, ready, dump in procs:
            before = os.path.getsize(dump)
            os.kill(p.pid, signal.SIGRTMIN + 3)
            deadline = time.time() + 10
            while os.path.getsize(dump) == before and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(0.3)
        if twice and n == 0:
            time.sleep(1)


def main():
    out, python, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    twice = "--twice" in sys.argv
    tmp = tempfile.mkdtemp(prefix="pytrace-")
    procs = []
    try:
        if mode == "gloo":
            port = "29731"
            d0, d1 = out + "_rank0.txt", out + "_rank1.txt"
            for d in (d0, d1):
                open(d, "w").close()
            p0, r0 = start(python, "gloo", d0, tmp, [port])
            procs.append((p0, r0, d0))
            p1, r1 = start(python, "gloo-peer", d1, tmp, [port])
            procs.append((p1, r1, d1))
        else:
            d = out + ".txt"
            open(d, "w").close()
            env = {}
            if mode == "fifo":
                env["FIFO"] = os.path.join(tmp, "fifo")
                os.mkfifo(env["FIFO"])
            p, r = start(python, mode, d, tmp, env_extra=env)
            procs.append((p, r, d))
        dump_and_kill(procs, twice)
    finally:
        for p, _, _ in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


if __name__ == "__main__":
    main()
