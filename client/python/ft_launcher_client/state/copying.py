"""Moving a state's bytes: the copy threads and the primitives they run.

A save or a load is one large copy (a payload of gigabytes into or out of
the launcher's segment or a file); it is split into byte ranges of about
equal length that the calling thread and a kept pool of copy threads move
at the same time (ctypes.memmove, os.pwrite and zlib release the GIL).
Every module that moves bytes goes through here, and looks up memmove and
pwrite_all on this module when it calls them, so that the tests can make
one copy thread fail, or slow, by patching this module alone.
"""

import ctypes
import os
import threading

from .common import COPY_THREADS_ENV, StateError

MIB = 1 << 20
MIN_CHUNK = 8 * MIB  # a copy thread's least share: smaller ones cost more in hand-offs than they gain
CHUNK_ALIGN = 64 << 10
AUTO_THREADS_CAP = 8
MAX_THREADS = 64


def copy_threads():
    """How many threads a save or a load copies with: $FT_STATE_COPY_THREADS
    (a whole number from 1 to 64; 1 copies in the calling thread alone), or
    when it is unset, empty or "auto", the CPUs this process may run on
    (sched_getaffinity) divided by $LOCAL_WORLD_SIZE (the node's ranks, which
    save at the same moment), at least 1 and at most 8."""
    v = os.environ.get(COPY_THREADS_ENV, "").strip()
    if v in ("", "auto"):
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        try:
            ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or "1"))
        except ValueError:
            ranks = 1
        return max(1, min(AUTO_THREADS_CAP, cpus // ranks))
    try:
        n = int(v)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:
        raise StateError("%s=%r: want a whole number from 1 to %d, or auto (CPUs / LOCAL_WORLD_SIZE, at most %d)"
                         % (COPY_THREADS_ENV, v, MAX_THREADS, AUTO_THREADS_CAP))
    return n


class Pool:
    """The copy threads of this process, started on first use and kept
    (a save every few steps must not start threads each time). After a
    fork the child's threads do not exist: it gets new ones."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.lock = threading.Lock()
        self.pid = None
        self.ex = None
        self.n = 0

    def get(self, n):
        import concurrent.futures

        with self.lock:
            if self.pid != os.getpid() or self.n < n:
                if self.pid == os.getpid() and self.ex is not None:
                    self.ex.shutdown(wait=False)  # its idle threads exit; a larger pool replaces it
                self.ex = concurrent.futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix=self.prefix)
                self.pid, self.n = os.getpid(), n
            return self.ex


copy_pool = Pool("ftstate-copy")  # the copy threads besides the caller's


def memmove(dst, src, n):
    """Copy n bytes between addresses; ctypes releases the GIL around the
    call: threads copy in parallel."""
    ctypes.memmove(dst, src, n)


def pwrite_all(fd, b, off):
    """Write all of buffer b to fd at offset off."""
    done = 0
    while done < len(b):
        done += os.pwrite(fd, b[done:], off + done)


def buffer_at(addr, n):
    """The n bytes at address addr as a writable memoryview (no copy)."""
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def addr(b):
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(b))


def cpu_view(t):
    """The bytes of tensor t (contiguous, on the CPU) without a copy."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def pieces(bufs, off):
    """(destination offset, source address, length) of each non-empty
    buffer of bufs written back to back from off."""
    out = []
    for b in bufs:
        n = len(b)
        if n:
            out.append((off, addr(b), n))
        off += n
    return out


def spread(pieces, fn, nthreads):
    """Run fn(dst, src, n) over pieces [(dst, src, n)], where dst and src
    are addresses or offsets that advance together, split into up to
    nthreads byte ranges of equal length (pieces are cut where a range ends,
    so one large tensor is shared too); the calling thread does the first
    range, the pool's threads the others. Returns when every range is done
    (even when one failed: nothing may write after the caller goes on) and
    raises the first exception. Returns the number of ranges."""
    ranges = split(pieces, nthreads)
    if len(ranges) == 1:
        for d, s, n in pieces:
            fn(d, s, n)
        return 1
    parallel([lambda r=r: _run_range(fn, r) for r in ranges], nthreads)
    return len(ranges)


def split(pieces, nthreads):
    """pieces [(dst, src, n)] cut into up to nthreads lists of about equal
    byte length (at least MIN_CHUNK each), in order."""
    total = sum(p[2] for p in pieces)
    parts = max(1, min(nthreads, total // MIN_CHUNK))
    if parts == 1:
        return [pieces]
    per = -(-total // parts)
    per = -(-per // CHUNK_ALIGN) * CHUNK_ALIGN
    ranges, cur, room = [], [], per
    for d, s, n in pieces:
        while n:
            k = min(n, room)
            cur.append((d, s, k))
            d, s, n, room = d + k, s + k, n - k, room - k
            if room == 0:
                ranges.append(cur)
                cur, room = [], per
    if cur:
        ranges.append(cur)
    return ranges


def parallel(tasks, nthreads):
    """Run the callables: the first in the calling thread, the others on
    the copy threads; return when all are done (even when one failed) and
    raise the first exception."""
    import concurrent.futures

    futs = [copy_pool.get(nthreads - 1).submit(t) for t in tasks[1:]]
    err = None
    try:
        tasks[0]()
    except BaseException as e:
        err = e
    finally:
        concurrent.futures.wait(futs)
    for f in futs:
        e = f.exception()
        if e is not None and err is None:
            err = e
    if err is not None:
        raise err


def _run_range(fn, pieces):
    for d, s, n in pieces:
        fn(d, s, n)
