#!/usr/bin/python3
"""What the save's checksum costs (docs/state.md, "Integrity";
docs/benchmarks.md, "State integrity: checksum cost and write-out cadence").

Per GiB of payload (--mib MiB of random bytes, --reps rounds, median and
worst): a memcpy (the physical floor of a save), zlib.crc32 (what
ft_launcher_client.state uses: CRC-32 IEEE, the CRC the launcher's Go
reader checks with its hardware-assisted crc32), state.format.crc_bufs on 2 and 4
threads (the CRC split across the copy threads and combined), and the
other checks the standard library offers (adler32, sha1, md5, blake2b).
With --torch, per typical save: state.save of --save-mib MiB of float32
tensors (16 MiB each) into a segment in /dev/shm with checksum=False and
checksum=True, with the copy threads (auto) and with 1 thread, and
state.load(into=) with and without the check.

    /usr/bin/python3 bench/state_crc_bench.py --mib 256 --reps 7 --torch
"""

import argparse
import ctypes
import hashlib
import os
import shutil
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))

from ft_launcher_client import state  # noqa: E402
from ft_launcher_client.state import format as state_format  # noqa: E402


def measure(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2], ts[-1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--torch", action="store_true")
    p.add_argument("--save-mib", type=int, default=256)
    a = p.parse_args()
    n = a.mib << 20
    src = bytearray(os.urandom(1 << 20) * a.mib)
    dst = bytearray(n)
    sa = ctypes.addressof(ctypes.c_char.from_buffer(src))
    da = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    ctypes.memmove(da, sa, n)  # dst's pages exist, as a slot's do
    mv = memoryview(src)
    per = (1 << 30) / n
    print("load average %s; %d CPUs; zlib %s" % (os.getloadavg(), len(os.sched_getaffinity(0)), zlib.ZLIB_RUNTIME_VERSION))
    print("%-34s %10s %10s   (seconds per GiB)" % ("", "median", "worst"))
    cases = [
        ("memcpy (the floor of a save)", lambda: ctypes.memmove(da, sa, n)),
        ("zlib.crc32 (1 thread)", lambda: zlib.crc32(mv)),
        ("format.crc_bufs, 2 threads", lambda: state_format.crc_bufs([mv], 2)),
        ("format.crc_bufs, 4 threads", lambda: state_format.crc_bufs([mv], 4)),
        ("zlib.adler32", lambda: zlib.adler32(mv)),
        ("hashlib.sha1", lambda: hashlib.sha1(mv).digest()),
        ("hashlib.md5", lambda: hashlib.md5(mv).digest()),
        ("hashlib.blake2b", lambda: hashlib.blake2b(mv).digest()),
    ]
    for name, fn in cases:
        fn()  # warm: the pool's threads started
        med, worst = measure(fn, a.reps)
        print("%-34s %10.3f %10.3f" % (name, med * per, worst * per))
    if not a.torch:
        return
    import torch

    root = tempfile.mkdtemp(prefix="ftstate-crc-", dir="/dev/shm")
    os.environ.update({state.SHM_DIR_ENV: root, state.DIR_ENV: os.path.join(root, "ckpt"), "LOCAL_RANK": "0", "RANK": "0",
                       "LOCAL_WORLD_SIZE": "1"})
    try:
        st = {"model": {"p%d" % i: torch.randn(4 << 20) for i in range(a.save_mib // 16)}}
        dst_t = {"model": {k: torch.empty_like(v) for k, v in st["model"].items()}}
        auto = state.copy_threads()
        for _ in range(3):  # both slots' pages exist
            state.save(0, st, checksum=False)

        def one(fn):
            def run():
                os.environ[state.COPY_THREADS_ENV] = "1"
                try:
                    fn()
                finally:
                    os.environ.pop(state.COPY_THREADS_ENV, None)
            return run

        print("\nper save of %d MiB (%d tensors), copy threads auto = %d" % (a.save_mib, len(st["model"]), auto))
        rows = [
            ("save checksum=False", lambda: state.save(1, st, checksum=False), None),
            ("save checksum=True", lambda: state.save(1, st, checksum=True), None),
            ("save checksum=False, 1 thread", one(lambda: state.save(1, st, checksum=False)), None),
            ("save checksum=True, 1 thread", one(lambda: state.save(1, st, checksum=True)), None),
            ("load(into=) unchecked", lambda: state.load(into=dst_t), lambda: state.save(1, st, checksum=False)),
            ("load(into=) CRC checked", lambda: state.load(into=dst_t), lambda: state.save(1, st, checksum=True)),
        ]
        print("%-34s %10s %10s   (seconds)" % ("", "median", "worst"))
        for name, fn, setup in rows:
            ts = []
            for _ in range(a.reps):
                if setup:
                    setup()
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            ts.sort()
            print("%-34s %10.4f %10.4f" % (name, ts[len(ts) // 2], ts[-1]))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
