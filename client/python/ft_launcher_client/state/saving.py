"""save() and wait(): where a save goes, and the overlapped save in flight.

A save encodes the state (format.py) and stores it in the launcher's
segment (segment.py), or in the state directory (files.py) when there is
no launcher or the segment would not fit in memory. With overlap=True the
copy runs on a save thread while the loop goes on; the save is committed
only if no saved tensor changed in place meanwhile (its version counter),
and wait() (called first by the next save, load or heal) returns its
outcome. The one save in flight is this module's state.
"""

import logging
import os
import time

from . import copying
from .common import NoRoom, log, this_rank
from .files import save_file, state_dir
from .format import encode
from .into import path_text
from .segment import rank_segment

save_pool = copying.Pool("ftstate-save")  # runs an overlapped save (save(overlap=True))
warned_no_room = [False]  # a save that did not fit was logged (save)
pending = [None]  # the overlapped save in flight (_Pending), at most one
overlap_refused = [0]  # overlapped saves refused for an in-place change (save)


def save(step, state, monitor=None, checksum=True, path=None, overlap=False):
    """Save ``state`` (any picklable object; tensors anywhere in it are
    copied as raw bytes) as the state after ``step``.

    Under ft-launcher (--state-dir) it goes into the launcher's memory and
    blocks only for the copy (split across copying.copy_threads() threads,
    $FT_STATE_COPY_THREADS); otherwise, or when it does not fit in memory
    (a warning says so), into ``path`` / $FT_STATE_DIR / ./ft_state. With a
    connected ``monitor`` (RankMonitorClient) the save is a "checkpointing"
    section, so the launcher's rank_checkpoint events count it.
    ``checksum=True`` (the default) adds a CRC-32 of the payload to the
    memory copy (computed on the copy threads, about 0.2 s per GiB of one
    core here): load() checks it and falls back to an older intact save
    when it does not match, and the launcher writes a save out only after
    checking it, so a bit flipped in memory is never written to disk with a
    fresh CRC vouching for it. ``checksum=False`` saves that time; load()
    and the writer then notice only damage that breaks the descriptor or
    the payload's structure, not a flipped bit in a tensor's bytes, and a
    written-out file's CRC covers only what the launcher read. Returns a
    dict: step, bytes, seconds, where ("memory" or "file"), threads.

    ``overlap=True`` returns once the structure is taken (the pickling of
    the non-tensor part; GPU and non-contiguous tensors are copied to
    contiguous host memory here), and copies the tensors' bytes in the
    background while the loop goes on; wait() (and the next save, load or
    heal) blocks until that save is committed or refused. Until then the
    loop must not change the saved tensors in place: call wait() before
    optimizer.step(). A save during which a saved tensor was changed in
    place (its version counter moved) is not committed (the previous save
    stays the newest) and is logged; a change through ``.data`` moves no
    version counter and is not detected. The dict returned then has where
    "pending" and seconds the call's own stall; wait() returns the final
    one."""
    step = int(step)
    nthreads = copying.copy_threads()
    live = monitor is not None and getattr(monitor, "is_initialized", False)
    if live:
        monitor.start_section("checkpointing")
    try:
        start = time.perf_counter()
        wait()  # an overlapped save still in flight: this call waits for it
        if overlap:
            origins = []
            bufs, length, keep = encode(state, origins)
            p = _Pending(step, state, origins, keep, length)
            p.call_secs = time.perf_counter() - start
            # Where it goes is fixed now: an in-process rejoin may change
            # LOCAL_RANK and RANK before the copy ends.
            p.future = save_pool.get(1).submit(p.run, bufs, checksum, state_dir(path), nthreads, rank_segment(), this_rank())
            pending[0] = p
            return {"step": step, "bytes": length, "seconds": p.call_secs, "where": "pending", "threads": nthreads}
        bufs, length, _keep = encode(state)
        where = store(step, bufs, length, checksum, state_dir(path), nthreads, lambda: int((time.perf_counter() - start) * 1e9),
                       rank_segment(), this_rank())
        secs = time.perf_counter() - start
    finally:
        if live:
            monitor.end_section("checkpointing")
    return {"step": step, "bytes": length, "seconds": secs, "where": where, "threads": nthreads}


def store(step, bufs, length, checksum, d, nthreads, commit, seg, rank):
    """Write an encoded save to the launcher's segment seg (a segment.Segment or
    None), or to a file in directory d when there is none or it does not
    fit; returns "memory" or "file"."""
    try:
        if seg is None:
            raise NoRoom("")
        seg.save(step, bufs, length, checksum, nthreads, commit, rank)
        return "memory"
    except NoRoom as e:
        if seg is not None:
            # Once per process: every later save takes the same way.
            lvl = logging.DEBUG if warned_no_room[0] else logging.WARNING
            warned_no_room[0] = True
            log.log(lvl, "ft-launcher state: %s; saving to files in %s instead (this process's later saves too)",
                    e, d)
        save_file(d, step, bufs, length, commit, rank)
        return "file"


class _Modified(Exception):
    """A saved tensor was changed in place during an overlapped save."""

    def __init__(self, tensor):
        super().__init__("changed in place")
        self.tensor = tensor


class _Pending:
    """An overlapped save in flight: run() copies and commits it on the
    save thread; the loop's thread waits for it in wait()."""

    def __init__(self, step, state, origins, keep, length):
        self.step, self.state, self.length = step, state, length
        self.versions = [(t, t._version) for t in origins]
        self.keep = keep  # the tensors whose memory is copied (host copies among them)
        self.pid = os.getpid()
        self.call_secs = 0.0
        self.wait_start = None
        self.copy_start = self.copy_secs = None
        self.future = None

    def commit(self):
        """After the copy, before the commit: refuse a save whose tensors
        changed meanwhile; else the loop's stall so far (the call, and the
        wait when the loop already waits) is what the save records."""
        now = time.perf_counter()
        self.copy_secs = now - self.copy_start
        for t, v in self.versions:
            if t._version != v:
                raise _Modified(t)
        w = self.wait_start
        return int((self.call_secs + (now - w if w is not None else 0.0)) * 1e9)

    def run(self, bufs, checksum, d, nthreads, seg, rank):
        self.copy_start = time.perf_counter()
        info = {"step": self.step, "bytes": self.length, "threads": nthreads}
        try:
            info["where"] = store(self.step, bufs, self.length, checksum, d, nthreads, self.commit, seg, rank)
            info["committed"] = True
        except _Modified as e:
            place = _place(self.state, e.tensor)
            overlap_refused[0] += 1
            lvl = logging.DEBUG if overlap_refused[0] > 1 else logging.WARNING
            log.log(lvl, "ft-launcher state: the overlapped save of step %d was not committed: the tensor at %s "
                    "changed in place while it was copied (%d such saves in this process); the previous save stays "
                    "the newest. Call state.wait() (ctx.state.wait()) before optimizer.step() or any in-place change",
                    self.step, place, overlap_refused[0])
            info.update(where=None, committed=False, modified=place)
        finally:
            self.keep = self.state = None
        info["copy_seconds"] = self.copy_secs
        return info


def _place(obj, t, path=()):
    """Where tensor t sits in obj (dicts, lists, tuples), as into.path_text writes it."""
    if obj is t:
        return path_text(path)
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        got = _place(v, t, path + (k,))
        if got is not None:
            return got
    return None if path else "a tensor of the state"


def wait():
    """Block until the overlapped save in flight (save(overlap=True)), if
    any, is committed or refused. Returns None when there is none, else
    its dict: step, bytes, where ("memory", "file", or None when refused),
    committed, modified (the place of the tensor changed in place, when
    refused), threads, copy_seconds (the background copy and commit),
    call_seconds, wait_seconds, and seconds, the loop's stall: call plus
    wait. The save's error, if it failed, is raised here."""
    p = pending[0]
    if p is None:
        return None
    pending[0] = None
    if p.pid != os.getpid():
        return None  # a forked child: the parent's save is the parent's to wait for
    p.wait_start = time.perf_counter()
    info = p.future.result()
    waited = time.perf_counter() - p.wait_start
    info.update(call_seconds=p.call_secs, wait_seconds=waited, seconds=p.call_secs + waited)
    return info
