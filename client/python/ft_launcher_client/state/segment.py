"""The rank's shared-memory segment: where a save goes under ft-launcher.

The launcher owns one file per local rank in /dev/shm
($FT_STATE_SHM_DIR/rank-$LOCAL_RANK) that outlives the rank: a header,
then two slots of equal capacity. A save writes the slot that does not
hold the newest save (or the newest, when the launcher's writer has
pinned the other to write it out) and commits it by writing its
descriptor last; a load reads the newest committed slot and checks that
its saver did not reuse it meanwhile. The saving process keeps its
mapping from save to save, so that a save is a memcpy into pages already
mapped; a load maps the one slot it reads. The byte layout is format.py's,
shared with the launcher's Go side (state/layout.go).
"""

import ctypes
import os
import zlib

from . import copying
from .copying import MIB
from .common import SHM_DIR_ENV, Mismatch, NoRoom, StateError, UntrustedClassError, log
from .format import DESC_OFF, FLAG_CRC, HEADER, MAGIC, PIN, PIN_OFF, crc_bufs, decode, desc_pack, desc_unpack

def slots(fd):
    """The two slot descriptors (None where not committed)."""
    h = os.pread(fd, HEADER, 0)
    if len(h) < HEADER:
        return [None, None]
    if h[:8] != MAGIC:
        raise StateError("state segment: magic %r, not an ft-launcher state segment" % h[:8])
    return [desc_unpack(h[o:o + 64]) for o in DESC_OFF]


def pinned(fd):
    """The seq of the save the launcher's writer is copying (0: none; a
    torn or damaged pin reads as none: the writer's own check covers it)."""
    b = os.pread(fd, PIN.size + 4, PIN_OFF)
    if len(b) < PIN.size:
        return 0
    seq, c = PIN.unpack_from(b)
    return seq if seq and c == zlib.crc32(b[:8]) else 0


def claim(fd, ds, top):
    """The slot a save writes, its descriptor zeroed (from here it names no
    save). Not the newest save's slot, so that a save killed midway leaves
    that save readable; but when the launcher's writer has pinned the other
    slot (it is writing that older save out to a file), the newest's: the
    pinned save stays committed throughout, and a rank that saves faster
    than a write-out completes no longer overwrites the save being written
    out (which restarted the write-out, up to 8 times, and then gave up:
    no file at all under continuous saves). A save killed midway then
    leaves the pinned save, one older. The writer pins, then checks that
    the slot is still committed; the saver zeroes the slot, then checks
    the pin: both go through the kernel, so one of the two sees the
    other's write and backs off."""
    zero = b"\0" * 64
    for _ in range(4):
        pin = pinned(fd)
        target = 1 - top
        if pin and ds[target] is not None and ds[target][0] == pin:
            target = top
        raw = os.pread(fd, 64, DESC_OFF[target])
        os.pwrite(fd, zero, DESC_OFF[target])
        if ds[target] is None or pinned(fd) != ds[target][0]:
            return target
        os.pwrite(fd, raw, DESC_OFF[target])  # pinned meanwhile: the writer copies it, untouched
    # The pin kept moving (not seen): the writer's check after its copy
    # sees the slot reused and copies the newest save again.
    target = 1 - top
    os.pwrite(fd, zero, DESC_OFF[target])
    return target


def newest(ds):
    """The index of the slot holding the newest committed save, or None."""
    best = None
    for i, d in enumerate(ds):
        if d is not None and (best is None or d[0] > ds[best][0]):
            best = i
    return best


def mem_available():
    """MemAvailable of /proc/meminfo in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


_MADV_POPULATE_READ = 22
# How a load with more than one copy thread maps the slot: "threads" (each
# thread populates its own range; measured faster for new tensors, as fast
# for into=, docs/benchmarks-history.md "Parallel and overlapped save") or
# "map" (MAP_POPULATE, as one thread does). Kept for bench/state_threads_ab.py.
LOAD_POPULATE = "threads"
_MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels: EINVAL, the pages fault in on first use instead


class _SlotView:
    """A read-only mapping of one slot's payload, populated at once
    (MAP_POPULATE: the page tables filled in one call, not a fault per 4 KiB
    page; with several copy threads, each populates its own range), read
    with memmove: 1.1-1.5x faster than preadv from tmpfs, which looks
    up and locks every page. Only for ranges inside the file (checked by
    the caller): past its end a mapping's access is SIGBUS."""

    def __init__(self, fd, off, length, nthreads=1):
        import mmap

        self.nthreads = nthreads
        # With more than one thread each fills its own range's page tables
        # (MADV_POPULATE_READ) before copying it, in parallel.
        self.threaded = nthreads > 1 and LOAD_POPULATE == "threads"
        flags = mmap.MAP_SHARED | (0 if self.threaded else getattr(mmap, "MAP_POPULATE", 0))
        page = mmap.PAGESIZE
        self.start = off // page * page
        self.size = off + length - self.start
        self.base = off - self.start
        self.libc = libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        a = libc.mmap(None, max(self.size, 1), mmap.PROT_READ, flags, fd, self.start)
        if a is None or a == ctypes.c_void_p(-1).value:
            e = ctypes.get_errno()
            raise OSError(e, "mmap of a state slot: %s" % os.strerror(e))
        self.addr = a

    def readers(self):
        at = self.addr + self.base

        def pread(off, n):
            return ctypes.string_at(at + off, n)

        page = os.sysconf("SC_PAGE_SIZE")
        madvise = self.libc.madvise

        def memmove(dst, off, n):
            copying.memmove(dst, at + off, n)

        def populate_memmove(dst, off, n):
            lo = (at + off) // page * page
            madvise(lo, at + off + n - lo, _MADV_POPULATE_READ)  # EINVAL before Linux 5.14: faults instead
            copying.memmove(dst, at + off, n)

        def populate_both(dst, off, n):
            # A new tensor's pages are faulted in one call per range, not
            # one fault per 4 KiB page during the copy.
            dlo = (dst + page - 1) // page * page
            dhi = (dst + n) // page * page
            if dhi > dlo:
                madvise(dlo, dhi - dlo, _MADV_POPULATE_WRITE)
            populate_memmove(dst, off, n)

        if self.threaded:
            return pread, lambda pieces, fresh=False: copying.spread(pieces, populate_both if fresh else populate_memmove, self.nthreads)

        return pread, lambda pieces, fresh=False: copying.spread(pieces, memmove, self.nthreads)

    def close(self):
        self.libc.munmap(self.addr, max(self.size, 1))


class _Mapping:
    """This process's mapping of its own segment, kept from save to save so
    that a save is a plain memcpy into pages already mapped (a pwrite into
    tmpfs costs 1.6-1.7x a memcpy here: the kernel looks up and locks every 4 KiB
    page; a first write through a fresh mapping costs more still, a page
    fault per page). A slot is written with pwrite until its pages are
    mapped in, which a background thread does (MADV_POPULATE_WRITE, the GIL
    released) after the slot's first save here. Only the saving process
    keeps a mapping; a load maps the one slot it reads (_SlotView) and
    unmaps it (a restarted process has no mapping to reuse)."""

    def __init__(self, path, fd):
        import mmap

        st = os.fstat(fd)
        self.fd, self.ino, self.size = fd, (st.st_dev, st.st_ino), st.st_size
        self.mm = mmap.mmap(fd, self.size)
        buf = (ctypes.c_char * self.size).from_buffer(self.mm)
        self.addr = ctypes.addressof(buf)
        del buf  # no export left: the mapping can be closed
        self.warm = set()  # slot offsets whose pages are mapped in
        self.threads = []

    def matches(self, st):
        return (st.st_dev, st.st_ino) == self.ino and st.st_size == self.size

    def write(self, bufs, off, cap, nthreads=1):
        """Write bufs at off (a slot of cap bytes): memcpy when the slot's
        pages are mapped in, else pwrite, and map them in the background;
        either split across nthreads threads (copying.spread)."""
        pieces = copying.pieces(bufs, off)
        if off in self.warm:
            base = self.addr
            copying.spread([(base + d, a, n) for d, a, n in pieces], copying.memmove, nthreads)
            return
        fd = self.fd
        copying.spread(pieces, lambda d, a, n: copying.pwrite_all(fd, copying.buffer_at(a, n), d), nthreads)
        self.warm.add(off)
        import threading

        t = threading.Thread(target=self._populate, args=(off, cap), name="ftstate-populate", daemon=True)
        t.start()
        self.threads.append(t)

    def _populate(self, off, cap):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            page = os.sysconf("SC_PAGE_SIZE")
            start = off // page * page
            libc.madvise(self.addr + start, off + cap - start, _MADV_POPULATE_WRITE)
        except Exception as e:  # only a speed-up: the pages fault in on first use
            log.debug("ft-launcher state: populate slot at %d: %r", off, e)

    def close(self):
        for t in self.threads:
            t.join()
        self.mm.close()
        os.close(self.fd)


_maps = {}  # segment path -> _Mapping of this process (one saver per segment)


class Segment:
    """The launcher's segment at path: saves into it, reads from it."""

    def __init__(self, path):
        self.path = path

    def _mapping(self):
        """The cached mapping of the segment file now at self.path, or None
        when there is none (a fresh mapping is made for a segment that a
        grow or another launcher replaced)."""
        m = _maps.get(self.path)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if m is not None and st is not None and m.matches(st):
            return m
        if m is not None:
            del _maps[self.path]
            m.close()
        if st is None or st.st_size < HEADER:
            return None
        fd = os.open(self.path, os.O_RDWR)
        try:
            m = _Mapping(self.path, fd)
        except BaseException:
            os.close(fd)
            raise
        _maps[self.path] = m
        return m

    def save(self, step, bufs, length, checksum, nthreads, commit, rank):
        """Write a save into the slot that does not hold the newest one;
        commit() is called once every byte is written and returns the
        stall to record (ns); an exception from it, or from a copy thread,
        leaves the slot uncommitted (the previous save stays the newest)."""
        m = self._mapping()
        ds = slots(m.fd) if m is not None else [None, None]
        top = newest(ds)
        seq = 1 if top is None else ds[top][0] + 1
        crc = crc_bufs(bufs, nthreads) if checksum else 0
        flags = FLAG_CRC if checksum else 0
        if top is None or ds[top][4] < length:
            old = m.size if m is not None else 0
            return self._grow(seq, step, bufs, length, crc, flags, nthreads, commit, old, rank)
        cap = ds[top][4]
        if HEADER + 2 * cap > m.size:
            raise StateError("state segment %s: slots of %d bytes end at %d, past the segment's %d bytes"
                             % (self.path, cap, HEADER + 2 * cap, m.size))
        target = claim(m.fd, ds, top)  # the slot holds no save from here
        off = HEADER + target * cap
        m.write(bufs, off, cap, nthreads)
        dur = commit()
        # The commit goes through the kernel (its locked instructions order
        # it after the payload's stores, non-temporal ones included), so a
        # reader that sees the descriptor sees the payload.
        os.pwrite(m.fd, desc_pack(seq, step, off, length, cap, dur, rank, crc, flags), DESC_OFF[target])
        return seq

    def _grow(self, seq, step, bufs, length, crc, flags, nthreads, commit, old, rank):
        cap = (length * 5 // 4 + MIB - 1) // MIB * MIB
        size = HEADER + 2 * cap
        d = os.path.dirname(self.path)
        avail = mem_available()
        st = os.statvfs(d)
        free = st.f_bavail * st.f_frsize
        if (avail is not None and size > avail + old) or size > free + old:
            raise NoRoom(
                "the state segment needs %.1f MiB (2 slots of %.1f MiB for a %.1f MiB state) but only %.1f MiB "
                "of memory (MemAvailable) and %.1f MiB in %s are free"
                % (size / MIB, cap / MIB, length / MIB, (avail or 0) / MIB, free / MIB, d)
            )
        tmp = self.path + ".grow"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, MAGIC, 0)
            copying.spread(copying.pieces(bufs, HEADER), lambda d, a, n: copying.pwrite_all(fd, copying.buffer_at(a, n), d), nthreads)
            dur = commit()
            os.pwrite(fd, desc_pack(seq, step, HEADER, length, cap, dur, rank, crc, flags), DESC_OFF[0])
            os.rename(tmp, self.path)
            m = _maps.pop(self.path, None)
            if m is not None:  # the old segment's memory goes with its last mapping
                m.close()
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)
        return seq

    def open(self):
        """A read-only descriptor of the segment, or None when there is none."""
        try:
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def saves(self, fd, damaged):
        """The committed saves [(slot, descriptor)], newest first. A
        descriptor that names no save although it is not zero (its own CRC
        or its fields do not hold, on two reads: a saver writes a
        descriptor in one pwrite) is damaged: added to damaged."""
        h = os.pread(fd, HEADER, 0)
        if len(h) < HEADER:
            return []
        if h[:8] != MAGIC:
            raise StateError("state segment %s: magic %r, not an ft-launcher state segment" % (self.path, h[:8]))
        size = os.fstat(fd).st_size
        out = []
        for i, o in enumerate(DESC_OFF):
            raw = h[o:o + 64]
            d = desc_unpack(raw)
            why = None
            if d is None and raw != b"\0" * 64 and os.pread(fd, 64, o) == raw:
                why = "its descriptor is damaged (its CRC or its fields do not hold)"
            elif d is not None and (d[2] != HEADER + i * d[4] or d[2] + d[4] > size):
                why = ("its descriptor is inconsistent: payload at %d with slots of %d bytes in a segment of %d "
                       "(slot %d starts at %d)" % (d[2], d[4], size, i, HEADER + i * d[4]))
            if why is not None:
                damaged.append({"source": "memory", "slot": i, "seq": d[0] if d else None,
                                 "step": d[1] if d else None, "error": why})
                continue
            if d is not None:
                out.append((i, d))
        out.sort(key=lambda x: -x[1][0])
        return out

    def read(self, fd, i, d, verify, into, trusted=()):
        """The state of committed save d in slot i. Raises Changed when the
        saver reused the slot while it was read, Mismatch when into does
        not fit a save that is intact (UntrustedClassError when it names a
        class not trusted), StateError when the save is damaged
        (its CRC with verify and a saver's checksum; else the consistency
        of its payload)."""
        seq, step, off, length = d[:4]
        want = d[7] if (verify and d[8] & FLAG_CRC) else None
        view = _SlotView(fd, off, length, copying.copy_threads())
        try:
            try:
                state = decode(view.readers(), length, want, into, trusted)
            except (Mismatch, UntrustedClassError):
                # The caller's structure or trust, not damage: unless the
                # save's CRC fails too (a flipped bit can rename a class).
                if slots(fd)[i] != d:
                    raise Changed() from None
                if want is not None and zlib.crc32(view.readers()[0](0, length)) != want:
                    raise StateError("payload CRC does not match the saver's %08x" % want) from None
                raise
            except Exception as e:
                if slots(fd)[i] != d:
                    raise Changed() from None
                if isinstance(e, StateError):
                    raise
                raise StateError("the payload does not decode: %r" % e) from e
        finally:
            view.close()
        if slots(fd)[i] != d:  # overwritten while it was read
            raise Changed()
        return state


class Changed(Exception):
    """A slot was reused by its saver while it was read (read again)."""


def rank_segment():
    """This rank's segment ($FT_STATE_SHM_DIR/rank-$LOCAL_RANK), or None
    without ft-launcher's --state-dir."""
    d = os.environ.get(SHM_DIR_ENV)
    if not d:
        return None
    return Segment(os.path.join(d, "rank-%s" % (os.environ.get("LOCAL_RANK", "0") or "0")))
