"""Training state kept by ft-launcher (docs/state.md).

    from ft_launcher_client import state

    step, saved = state.load()              # (None, None) on the first run
    if saved is not None:
        model.load_state_dict(saved["model"]); opt.load_state_dict(saved["opt"])
    for step in range(0 if step is None else step + 1, steps):
        ...one step...
        state.save(step, {"model": model.state_dict(), "opt": opt.state_dict()})

Under ft-launcher with ``--state-dir`` a save copies the state into a
shared-memory segment that the rank's launcher owns
($FT_STATE_SHM_DIR/rank-$LOCAL_RANK): it outlives the rank, and the process
that next holds the rank loads it from memory (a memory copy into new
tensors, not a deserialisation). The launcher writes committed saves to
--state-dir in the background. Without ft-launcher, or when the segment would
not fit in memory, save() writes the same format to a file (atomically) and
load() reads it; ``load_file(path)`` reads a written-out state anywhere.

Standard library only; torch is used only when the state holds tensors
(and is never imported here). The pickled part of a state is trusted as
``torch.load(weights_only=False)`` trusts a checkpoint: load only states
your job wrote.
"""

import ctypes
import io
import json
import logging
import os
import pickle
import struct
import sys
import tempfile
import time
import zlib

log = logging.getLogger(__name__)

SHM_DIR_ENV = "FT_STATE_SHM_DIR"
DIR_ENV = "FT_STATE_DIR"
DEFAULT_DIR = "ft_state"  # the fallback directory without ft-launcher

# Segment layout: state/layout.go (both sides must agree).
MAGIC = b"FTSHM001"
HEADER = 4096
DESC_OFF = (64, 128)
FLAG_CRC = 1
_DESC = struct.Struct("<QqQQQQiII")  # seq step off len cap dur_ns rank payload_crc flags; + u32 own crc
_MIB = 1 << 20

# Written-out file: state/file.go.
FILE_MAGIC = b"FTSTATE1"
FILE_HEADER = 64
FILE_VERSION = 1
MANIFEST_FORMAT = "ft-launcher-state/1"
_FILE_HDR = struct.Struct("<8sIIqQIiQQ")  # magic ver flags step len crc rank seq dur_ns (56 of 64 bytes)

# Payload: magic, skeleton length, tensor count, skeleton pickle, zero pad
# to 8, then each tensor's bytes, each padded to 8.
_PAYLOAD = struct.Struct("<8sQQ")
_PAYLOAD_MAGIC = b"FTPAYLD1"
_TENSOR_TAG = "ftstate.tensor"


class StateError(Exception):
    """A state that cannot be saved or loaded (the message says why)."""


class _NoRoom(StateError):
    """The segment would not fit in memory; the save goes to a file."""


def _pad8(n):
    return (8 - n % 8) % 8


def _rank():
    return int(os.environ.get("RANK", "0") or "0")


# -- payload ---------------------------------------------------------------


def _cpu_view(t):
    """The bytes of tensor t (contiguous, on the CPU) without a copy."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors):
        super().__init__(f, protocol=4)
        self._tensors = tensors
        self._ids = {}
        self._torch = sys.modules.get("torch")

    def persistent_id(self, obj):
        torch = self._torch
        if torch is None or not isinstance(obj, torch.Tensor):
            return None
        idx = self._ids.get(id(obj))
        if idx is None:
            t = obj.detach()
            if t.layout != torch.strided:
                raise StateError("tensor with layout %s: only dense (strided) tensors can be saved" % t.layout)
            if t.device.type != "cpu":
                t = t.cpu()  # host copy; restored on the CPU (docs/state.md)
            t = t.contiguous()
            idx = len(self._tensors)
            self._tensors.append(t)
            self._ids[id(obj)] = idx
        t = self._tensors[idx]
        return (_TENSOR_TAG, idx, str(t.dtype).replace("torch.", ""), tuple(t.shape))


def _encode(state):
    """(buffers, total length): the payload as a list of buffers written in
    order, the tensors' own memory among them (no copy)."""
    tensors = []
    f = io.BytesIO()
    _Pickler(f, tensors).dump(state)
    skel = f.getvalue()
    head = _PAYLOAD.pack(_PAYLOAD_MAGIC, len(skel), len(tensors)) + skel
    head += b"\0" * _pad8(len(head))
    bufs = [memoryview(head)]
    n = len(head)
    for t in tensors:
        v = _cpu_view(t)
        bufs.append(v)
        n += len(v)
        if _pad8(len(v)):
            bufs.append(memoryview(b"\0" * _pad8(len(v))))
            n += _pad8(len(v))
    return bufs, n, tensors


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, make):
        super().__init__(f)
        self._make = make

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 4 and pid[0] == _TENSOR_TAG):
            raise StateError("unknown persistent id in a saved state: %r" % (pid,))
        return self._make(pid[1], pid[2], pid[3])


def _decode(read, length, verify_crc=None):
    """Rebuild a state from a payload read through read(off, n) -> bytes and
    readinto(off, memoryview). Returns the state; verify_crc, when given, is
    checked against the CRC-32 of every payload byte."""
    pread, preadinto = read
    head = pread(0, _PAYLOAD.size)
    magic, skel_len, ntensors = _PAYLOAD.unpack(head)
    if magic != _PAYLOAD_MAGIC:
        raise StateError("not an ft-launcher state payload (magic %r)" % magic)
    if _PAYLOAD.size + skel_len > length:
        raise StateError("state payload: skeleton of %d bytes past the payload's %d" % (skel_len, length))
    start = _PAYLOAD.size + skel_len
    data = pread(0, start + _pad8(start))
    check = verify_crc is not None
    crc = zlib.crc32(data) if check else 0
    metas = {}

    def collect(idx, dtype, shape):
        metas[idx] = (dtype, shape)
        return (idx,)

    # First pass: the tensors' metadata in order (persistent ids are
    # produced in first-appearance order, as they were saved).
    _Unpickler(io.BytesIO(data[_PAYLOAD.size:start]), collect).load()
    if len(metas) != ntensors:
        raise StateError("state payload: %d tensors described, header says %d" % (len(metas), ntensors))
    tensors = []
    off = len(data)
    if ntensors:
        import torch

        for idx in range(ntensors):
            dtype, shape = metas[idx]
            dt = getattr(torch, dtype, None)
            if not isinstance(dt, torch.dtype):
                raise StateError("state payload: unknown dtype %r" % dtype)
            t = torch.empty(shape, dtype=dt)
            v = _cpu_view(t)
            if off + len(v) > length:
                raise StateError("state payload: tensor %d past the payload's end" % idx)
            if len(v):
                preadinto(off, v)
                if check:
                    crc = zlib.crc32(v, crc)
            off += len(v)
            if _pad8(len(v)):
                if check:
                    crc = zlib.crc32(b"\0" * _pad8(len(v)), crc)
                off += _pad8(len(v))
            tensors.append(t)
    if off != length:
        raise StateError("state payload: %d bytes described, %d stored" % (off, length))
    if check and crc != verify_crc:
        raise StateError("state payload: CRC %08x, saved %08x (corrupt or overwritten while read)" % (crc, verify_crc))
    return _Unpickler(io.BytesIO(data[_PAYLOAD.size:start]), lambda i, d, s: tensors[i]).load()


def _pwrite_bufs(fd, bufs, off):
    """Write bufs back to back at off; returns the CRC-32 of the bytes when
    crc is wanted (computed per buffer, from the same memory)."""
    for b in bufs:
        done = 0
        while done < len(b):
            done += os.pwrite(fd, b[done:], off + done)
        off += len(b)


def _crc_bufs(bufs):
    c = 0
    for b in bufs:
        c = zlib.crc32(b, c)
    return c


def _preaders(fd, base):
    def pread(off, n):
        b = os.pread(fd, n, base + off)
        if len(b) != n:
            raise StateError("state: short read (%d of %d bytes)" % (len(b), n))
        return b

    def preadinto(off, v):
        done = 0
        while done < len(v):
            k = os.preadv(fd, [v[done:]], base + off + done)
            if k <= 0:
                raise StateError("state: short read")
            done += k

    return pread, preadinto


# -- the segment -----------------------------------------------------------


def _desc_pack(seq, step, off, length, cap, dur, rank, crc, flags):
    b = _DESC.pack(seq, step, off, length, cap, dur, rank, crc, flags)
    return b + struct.pack("<I", zlib.crc32(b))


def _desc_unpack(b):
    if len(b) < 64 or struct.unpack_from("<I", b, 60)[0] != zlib.crc32(b[:60]):
        return None
    d = _DESC.unpack_from(b)
    seq, step, off, length, cap = d[:5]
    if seq == 0 or length > cap or off < HEADER:
        return None
    return d


def _slots(fd):
    """The two slot descriptors (None where not committed)."""
    h = os.pread(fd, HEADER, 0)
    if len(h) < HEADER:
        return [None, None]
    if h[:8] != MAGIC:
        raise StateError("state segment: magic %r, not an ft-launcher state segment" % h[:8])
    return [_desc_unpack(h[o:o + 64]) for o in DESC_OFF]


def _newest(ds):
    best = None
    for i, d in enumerate(ds):
        if d is not None and (best is None or d[0] > ds[best][0]):
            best = i
    return best


def _mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _Segment:
    def __init__(self, path):
        self.path = path

    def save(self, step, bufs, length, checksum, start):
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            fd = None
        try:
            ds = _slots(fd) if fd is not None else [None, None]
            newest = _newest(ds)
            seq = 1 if newest is None else ds[newest][0] + 1
            crc = _crc_bufs(bufs) if checksum else 0
            flags = FLAG_CRC if checksum else 0
            if newest is None or ds[newest][4] < length:
                old = os.fstat(fd).st_size if fd is not None else 0
                return self._grow(seq, step, bufs, length, crc, flags, start, old)
            target = 1 - newest
            cap = ds[newest][4]
            off = HEADER + target * cap
            os.pwrite(fd, b"\0" * 64, DESC_OFF[target])  # the slot holds no save from here
            _pwrite_bufs(fd, bufs, off)
            dur = int((time.perf_counter() - start) * 1e9)
            os.pwrite(fd, _desc_pack(seq, step, off, length, cap, dur, _rank(), crc, flags), DESC_OFF[target])
            return seq
        finally:
            if fd is not None:
                os.close(fd)

    def _grow(self, seq, step, bufs, length, crc, flags, start, old):
        cap = (length * 5 // 4 + _MIB - 1) // _MIB * _MIB
        size = HEADER + 2 * cap
        d = os.path.dirname(self.path)
        avail = _mem_available()
        st = os.statvfs(d)
        free = st.f_bavail * st.f_frsize
        if (avail is not None and size > avail + old) or size > free + old:
            raise _NoRoom(
                "the state segment needs %.1f MiB (2 slots of %.1f MiB for a %.1f MiB state) but only %.1f MiB "
                "of memory (MemAvailable) and %.1f MiB in %s are free"
                % (size / _MIB, cap / _MIB, length / _MIB, (avail or 0) / _MIB, free / _MIB, d)
            )
        tmp = self.path + ".grow"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, MAGIC, 0)
            _pwrite_bufs(fd, bufs, HEADER)
            dur = int((time.perf_counter() - start) * 1e9)
            os.pwrite(fd, _desc_pack(seq, step, HEADER, length, cap, dur, _rank(), crc, flags), DESC_OFF[0])
            os.rename(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)
        return seq

    def load(self, verify=True):
        """(step, state) of the newest committed save, or (None, None)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None, None
        try:
            for _ in range(8):
                ds = _slots(fd)
                i = _newest(ds)
                if i is None:
                    return None, None
                d = ds[i]
                seq, step, off, length = d[:4]
                want = d[7] if (verify and d[8] & FLAG_CRC) else None
                try:
                    state = _decode(_preaders(fd, off), length, want)
                except (StateError, pickle.UnpicklingError, EOFError):
                    if _slots(fd)[i] == d:
                        raise  # not a race with a saver: the save is bad
                    continue
                if _slots(fd)[i] == d:  # not overwritten while it was read
                    return step, state
            raise StateError("state segment %s: overwritten 8 times while being read" % self.path)
        finally:
            os.close(fd)


def _segment():
    d = os.environ.get(SHM_DIR_ENV)
    if not d:
        return None
    return _Segment(os.path.join(d, "rank-%s" % (os.environ.get("LOCAL_RANK", "0") or "0")))


# -- files -----------------------------------------------------------------


def _state_dir(path=None):
    return path or os.environ.get(DIR_ENV) or DEFAULT_DIR


def _fsync_dir(d):
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_manifest(d, rank):
    try:
        with open(os.path.join(d, "rank-%d.json" % rank)) as f:
            m = json.load(f)
    except FileNotFoundError:
        return None
    if m.get("format") != MANIFEST_FORMAT:
        raise StateError("state manifest in %s: format %r, want %r" % (d, m.get("format"), MANIFEST_FORMAT))
    return m


def _save_file(d, step, bufs, length, start):
    """The launcher's write-out format, written by the rank: data file and
    manifest, each atomically (temporary file, fsync, rename, fsync dir)."""
    rank = _rank()
    os.makedirs(d, exist_ok=True)
    old = _read_manifest(d, rank)
    seq = (old["seq"] if old else 0) + 1
    crc = _crc_bufs(bufs)
    # Not the launcher's rank-R-seq-Q name: a rank that saves to files (no
    # room in memory) beside the launcher's write-outs never overwrites one.
    name = "rank-%d-own-%d.ftstate" % (rank, seq)
    fd, tmp = tempfile.mkstemp(prefix=".ftstate-", suffix=".tmp", dir=d)
    try:
        dur = int((time.perf_counter() - start) * 1e9)
        hdr = _FILE_HDR.pack(FILE_MAGIC, FILE_VERSION, FLAG_CRC, step, length, crc, rank, seq, dur)
        _pwrite_bufs(fd, [memoryview(hdr + b"\0" * (FILE_HEADER - len(hdr)))] + bufs, 0)
        os.fsync(fd)
        os.close(fd)
        fd = None
        os.rename(tmp, os.path.join(d, name))
        m = {"format": MANIFEST_FORMAT, "rank": rank, "step": step, "seq": seq, "bytes": length, "crc32": crc,
             "file": name, "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "save_ms": dur / 1e6}
        mfd, mtmp = tempfile.mkstemp(prefix=".rank-%d.json.tmp" % rank, dir=d)
        with os.fdopen(mfd, "w") as f:
            json.dump(m, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.rename(mtmp, os.path.join(d, "rank-%d.json" % rank))
        _fsync_dir(d)
    except BaseException:
        if fd is not None:
            os.close(fd)
        for p in (tmp,):
            try:
                os.unlink(p)
            except OSError:
                pass
        raise
    if old and old.get("file") != name and os.sep not in old.get("file", os.sep):
        try:
            os.unlink(os.path.join(d, old["file"]))
        except OSError:
            pass
    return seq


def load_file(path, rank=None, verify=True):
    """Load a written-out state: ``path`` is a state directory (the
    manifest of ``rank``, default $RANK or 0, names the file), a manifest
    (``rank-R.json``) or a data file (``.ftstate``). Returns (step, state);
    raises FileNotFoundError when there is none and StateError when the file
    is damaged (its length or CRC does not match)."""
    if os.path.isdir(path):
        r = _rank() if rank is None else rank
        m = _read_manifest(path, r)
        if m is None:
            raise FileNotFoundError("no state manifest for rank %d in %s" % (r, path))
        path = os.path.join(path, m["file"])
    elif path.endswith(".json"):
        with open(path) as f:
            m = json.load(f)
        path = os.path.join(os.path.dirname(path), m["file"])
    fd = os.open(path, os.O_RDONLY)
    try:
        hdr = os.pread(fd, FILE_HEADER, 0)
        if len(hdr) < FILE_HEADER or hdr[:8] != FILE_MAGIC:
            raise StateError("%s: not an ft-launcher state file" % path)
        magic, ver, flags, step, length, crc, _, _, _ = _FILE_HDR.unpack_from(hdr)
        if ver != FILE_VERSION:
            raise StateError("%s: state file version %d, this client reads %d" % (path, ver, FILE_VERSION))
        size = os.fstat(fd).st_size
        if size != FILE_HEADER + length:
            raise StateError("%s: %d payload bytes, header says %d (truncated)" % (path, size - FILE_HEADER, length))
        return step, _decode(_preaders(fd, FILE_HEADER), length, crc if verify else None)
    finally:
        os.close(fd)


# -- the API ---------------------------------------------------------------


def save(step, state, monitor=None, checksum=False, path=None):
    """Save ``state`` (any picklable object; tensors anywhere in it are
    copied as raw bytes) as the state after ``step``.

    Under ft-launcher (--state-dir) it goes into the launcher's memory and
    blocks only for the copy; otherwise, or when it does not fit in memory
    (a warning says so), into ``path`` / $FT_STATE_DIR / ./ft_state. With a
    connected ``monitor`` (RankMonitorClient) the save is a "checkpointing"
    section, so the launcher's rank_checkpoint events count it.
    ``checksum=True`` adds a CRC-32 of the payload to the memory copy,
    checked by load() and the launcher (it about doubles the stall; crash
    consistency does not need it: an interrupted save is never committed).
    Files always carry a CRC (the launcher computes it when it writes a
    save out). Returns a dict: step, bytes, seconds,
    where ("memory" or "file")."""
    step = int(step)
    live = monitor is not None and getattr(monitor, "is_initialized", False)
    if live:
        monitor.start_section("checkpointing")
    try:
        start = time.perf_counter()
        bufs, length, _keep = _encode(state)
        seg = _segment()
        where = "memory"
        try:
            if seg is None:
                raise _NoRoom("")
            seg.save(step, bufs, length, checksum, start)
        except _NoRoom as e:
            if seg is not None:
                log.warning("ft-launcher state: %s; saving to files in %s instead", e, _state_dir(path))
            where = "file"
            _save_file(_state_dir(path), step, bufs, length, start)
        secs = time.perf_counter() - start
    finally:
        if live:
            monitor.end_section("checkpointing")
    return {"step": step, "bytes": length, "seconds": secs, "where": where}


def load(path=None, verify=True, info=None):
    """Return (step, state) of the newest save of this rank, or (None, None).

    Under ft-launcher the launcher's memory copy is read (a memory copy into
    new tensors); the written-out file of the state directory (``path`` /
    $FT_STATE_DIR / ./ft_state) is the fallback, and wins when it holds a
    newer step (a save that did not fit in memory). Tensors come back on
    the CPU. A dict given as ``info`` receives "source" ("memory", "file"
    or None) and "seconds"."""
    return _load(path, verify, info)


def _load(path=None, verify=True, info=None, note=None):
    """load(), with note's fields added to the restore note (heal.py)."""
    start = time.perf_counter()
    seg = _segment()
    got, source = seg.load(verify) if seg is not None else (None, None), "memory"
    d = _state_dir(path)
    m = _read_manifest(d, _rank()) if os.path.isdir(d) else None
    if m is not None and (got[0] is None or m["step"] > got[0]):
        got, source = load_file(d, verify=verify), "file"
    secs = time.perf_counter() - start
    if info is not None:
        info["source"] = source if got[0] is not None else None
        info["seconds"] = secs
    _note_restore(got[0], source if got[0] is not None else None, secs, **(note or {}))
    return got


def heal(step, state, groups=None, info=None, **kw):
    """Peer heal after an in-process rejoin: ft_launcher_client.heal.heal
    (docs/state.md, "Peer heal")."""
    from . import heal as _heal

    return _heal.heal(step, state, groups=groups, info=info, **kw)


_notes = [0]  # restore notes written by this process (their names' counter)


def _note_restore(step, source, secs, **extra):
    """Under ft-launcher, leave the launcher a note of where this load came
    from ($FT_STATE_SHM_DIR/restore-LOCALRANK-PID-N.json; its store turns it
    into a state_restore event that ft-resumer report shows). extra: the
    peer heal's fields (heal, why, from_rank, bytes, step_at). A note that
    cannot be written is only logged: a load never fails for it."""
    d = os.environ.get(SHM_DIR_ENV)
    if not d:
        return
    import datetime

    lr = int(os.environ.get("LOCAL_RANK", "0") or "0")
    _notes[0] += 1
    name = "restore-%d-%d-%d.json" % (lr, os.getpid(), _notes[0])
    body = {"local_rank": lr, "rank": _rank(), "step": step, "source": source, "load_ms": secs * 1e3,
            "round": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"),
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    body.update(extra)
    tmp = os.path.join(d, "." + name + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, os.path.join(d, name))
    except OSError as e:
        log.debug("ft-launcher state: restore note %s: %r", name, e)


class Bound:
    """save/load/heal bound to a rank's monitor client (``ctx.state`` of
    ft_launcher_client.inprocess), so saves count as checkpoints.
    last_step_at: a callable returning when the rank last called
    ctx.step() (epoch seconds), for heal's report."""

    def __init__(self, monitor, last_step_at=None):
        self._monitor = monitor
        self._last_step_at = last_step_at

    def heal(self, step, state, groups=None, info=None, **kw):
        """ft_launcher_client.heal.heal (peer heal after an in-process
        rejoin; docs/state.md, "Peer heal")."""
        from . import heal as _heal

        kw.setdefault("step_at", self._last_step_at)
        return _heal.heal(step, state, groups=groups, info=info, **kw)

    def save(self, step, state, checksum=False, path=None):
        m = self._monitor() if callable(self._monitor) else self._monitor
        return save(step, state, monitor=m, checksum=checksum, path=path)

    def load(self, path=None, verify=True, info=None):
        return load(path=path, verify=verify, info=info)
