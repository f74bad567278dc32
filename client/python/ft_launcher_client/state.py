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
tensors, not a deserialisation; with ``load(into=...)`` straight into the
tensors the caller already has). The launcher writes committed saves to
--state-dir in the background. Without ft-launcher, or when the segment would
not fit in memory, save() writes the same format to a file (atomically) and
load() reads it; ``load_file(path)`` reads a written-out state anywhere.
Saves and loads split their copy across copy_threads() threads
($FT_STATE_COPY_THREADS); ``save(..., overlap=True)`` copies in the
background until ``wait()``, and is not committed if a saved tensor was
changed in place meanwhile.

Standard library only; torch is used only when the state holds tensors
(and is never imported here). The pickled part of a state (its skeleton:
the containers around the tensors) is read by a restricted unpickler that
admits only what a training state holds (TRUSTED_BY_DEFAULT: containers,
numbers, strings, bytes, OrderedDict, torch dtypes, devices and Size,
numpy arrays and dtypes); anything else, from a launcher's memory, a
buddy, a peer or a file, is refused with an UntrustedClassError naming the
class, unless the caller opts in: ``load(..., trusted_classes=[...])`` or
$FT_STATE_TRUSTED_CLASSES (docs/state.md, "What a load executes").
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
import threading
import time
import warnings
import zlib

log = logging.getLogger(__name__)

SHM_DIR_ENV = "FT_STATE_SHM_DIR"
DIR_ENV = "FT_STATE_DIR"
DEFAULT_DIR = "ft_state"  # the fallback directory without ft-launcher
COPY_THREADS_ENV = "FT_STATE_COPY_THREADS"

# Segment layout: state/layout.go (both sides must agree).
MAGIC = b"FTSHM001"
HEADER = 4096
DESC_OFF = (64, 128)
FLAG_CRC = 1
# The launcher's writer pins the save it is copying to a file (16 bytes at
# PIN_OFF: that save's seq u64, the CRC-32 of those 8 bytes u32, zero u32);
# a saver leaves the pinned slot alone while it can (_Segment._claim).
PIN_OFF = 192
_PIN = struct.Struct("<QI")
# In a written-out file's flags: the CRC is the one the saver computed,
# checked against the payload before the file was written (the launcher's
# writer); without it the CRC was computed when the file was written.
FLAG_SAVE_CRC = 2
_DESC = struct.Struct("<QqQQQQiII")  # seq step off len cap dur_ns rank payload_crc flags; + u32 own crc
_MIB = 1 << 20
_MIN_CHUNK = 8 * _MIB  # a copy thread's least share: smaller ones cost more in hand-offs than they gain
_CHUNK_ALIGN = 64 << 10
_AUTO_THREADS_CAP = 8
_MAX_THREADS = 64

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


class CorruptStateWarning(UserWarning):
    """load() found a save that failed its integrity check (its CRC, or
    the consistency of its descriptor and payload) and restored an older
    source instead."""


class _Mismatch(StateError):
    """load(into=...): the caller's structure does not match the save."""


class _NoRoom(StateError):
    """The segment would not fit in memory; the save goes to a file."""


def _pad8(n):
    return (8 - n % 8) % 8


def _rank():
    return int(os.environ.get("RANK", "0") or "0")


# -- parallel copy ---------------------------------------------------------


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
        return max(1, min(_AUTO_THREADS_CAP, cpus // ranks))
    try:
        n = int(v)
    except ValueError:
        n = 0
    if not 1 <= n <= _MAX_THREADS:
        raise StateError("%s=%r: want a whole number from 1 to %d, or auto (CPUs / LOCAL_WORLD_SIZE, at most %d)"
                         % (COPY_THREADS_ENV, v, _MAX_THREADS, _AUTO_THREADS_CAP))
    return n


class _Pool:
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


_copy_pool = _Pool("ftstate-copy")  # the copy threads besides the caller's
_save_pool = _Pool("ftstate-save")  # runs an overlapped save (save(overlap=True))


def _memmove(dst, src, n):
    # ctypes releases the GIL around the call: threads copy in parallel.
    ctypes.memmove(dst, src, n)


def _buffer_at(addr, n):
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def _addr(b):
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(b))


def _pieces(bufs, off):
    """(destination offset, source address, length) of each non-empty
    buffer of bufs written back to back from off."""
    out = []
    for b in bufs:
        n = len(b)
        if n:
            out.append((off, _addr(b), n))
        off += n
    return out


def _spread(pieces, fn, nthreads):
    """Run fn(dst, src, n) over pieces [(dst, src, n)], where dst and src
    are addresses or offsets that advance together, split into up to
    nthreads byte ranges of equal length (pieces are cut where a range ends,
    so one large tensor is shared too); the calling thread does the first
    range, the pool's threads the others. Returns when every range is done
    (even when one failed: nothing may write after the caller goes on) and
    raises the first exception. Returns the number of ranges."""
    ranges = _split(pieces, nthreads)
    if len(ranges) == 1:
        for d, s, n in pieces:
            fn(d, s, n)
        return 1
    _parallel([lambda r=r: _run_range(fn, r) for r in ranges], nthreads)
    return len(ranges)


def _split(pieces, nthreads):
    """pieces [(dst, src, n)] cut into up to nthreads lists of about equal
    byte length (at least _MIN_CHUNK each), in order."""
    total = sum(p[2] for p in pieces)
    parts = max(1, min(nthreads, total // _MIN_CHUNK))
    if parts == 1:
        return [pieces]
    per = -(-total // parts)
    per = -(-per // _CHUNK_ALIGN) * _CHUNK_ALIGN
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


def _parallel(tasks, nthreads):
    """Run the callables: the first in the calling thread, the others on
    the copy threads; return when all are done (even when one failed) and
    raise the first exception."""
    import concurrent.futures

    futs = [_copy_pool.get(nthreads - 1).submit(t) for t in tasks[1:]]
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


# -- payload ---------------------------------------------------------------


def _cpu_view(t):
    """The bytes of tensor t (contiguous, on the CPU) without a copy."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors, origins=None):
        super().__init__(f, protocol=4)
        self._tensors = tensors
        self._origins = origins
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
            # Only a tensor whose own memory is copied can be changed under
            # an overlapped save; the others are copied here, in the call.
            own = t.device.type == "cpu" and t.is_contiguous()
            if t.device.type != "cpu":
                t = t.cpu()  # host copy; restored on the CPU (docs/state.md)
            t = t.contiguous()
            idx = len(self._tensors)
            self._tensors.append(t)
            if self._origins is not None and own:
                self._origins.append(obj)
            self._ids[id(obj)] = idx
        t = self._tensors[idx]
        return (_TENSOR_TAG, idx, str(t.dtype).replace("torch.", ""), tuple(t.shape))


def _encode(state, origins=None):
    """(buffers, total length, tensors): the payload as a list of writable
    buffers written in order, the tensors' own memory among them (no copy).
    origins, a list, receives each saved tensor as found in state whose own
    memory the buffers hold (CPU, contiguous)."""
    tensors = []
    f = io.BytesIO()
    _Pickler(f, tensors, origins).dump(state)
    skel = f.getvalue()
    head = bytearray(_PAYLOAD.pack(_PAYLOAD_MAGIC, len(skel), len(tensors)) + skel)
    head += b"\0" * _pad8(len(head))
    bufs = [memoryview(head)]
    n = len(head)
    for t in tensors:
        v = _cpu_view(t)
        bufs.append(v)
        n += len(v)
        if _pad8(len(v)):
            bufs.append(memoryview(bytearray(_pad8(len(v)))))
            n += _pad8(len(v))
    return bufs, n, tensors


# What a state's skeleton may name without an opt-in: what a model's and
# an optimizer's state_dict, an LR scheduler's, RNG states and the usual
# counters pickle to (listed by saving them with torch 1.13 and 2.x).
TRUSTED_BY_DEFAULT = frozenset([
    ("builtins", n) for n in ("bool", "int", "float", "complex", "str", "bytes", "bytearray", "list", "tuple",
                               "dict", "set", "frozenset", "slice", "range", "NoneType", "Ellipsis", "NotImplemented")
] + [
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "deque"), ("collections", "Counter"),
    ("torch", "Size"), ("torch", "device"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
])

# The opt-in for other classes: a comma-separated list of "module.name"
# (or "module:name"), or "*" to trust every class of the state (as
# torch.load(weights_only=False) does: only for states you wrote).
TRUSTED_CLASSES_ENV = "FT_STATE_TRUSTED_CLASSES"


class UntrustedClassError(StateError):
    """A state's skeleton names a class or function that a training state
    does not hold and the caller did not trust: nothing of it ran."""


def _trusted(extra):
    """The (module, name) pairs trusted beyond TRUSTED_BY_DEFAULT, from
    extra (classes, functions or "module.name" strings) and
    $FT_STATE_TRUSTED_CLASSES; the string "*" trusts everything."""
    out = set()
    items = list(extra or ())
    env = os.environ.get(TRUSTED_CLASSES_ENV, "")
    items += [x.strip() for x in env.split(",") if x.strip()]
    for x in items:
        if isinstance(x, str):
            if x == "*":
                return None
            mod, sep, name = x.partition(":")
            if not sep:
                mod, _, name = x.rpartition(".")
            if not mod or not name:
                raise StateError("trusted class %r: want \"module.name\" (e.g. \"mypkg.train.Config\") or \"*\"" % x)
            out.add((mod, name))
        elif hasattr(x, "__module__") and hasattr(x, "__qualname__"):
            out.add((x.__module__, x.__qualname__))
        else:
            raise StateError("trusted class %r: want a class, a function or a \"module.name\" string" % (x,))
    return out


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, make, trusted=()):
        super().__init__(f)
        self._make = make
        self._trusted = _trusted(trusted)

    def find_class(self, module, name):
        # Nothing a state names runs unless it is plain data: a pickle's
        # globals are what it can call (os.system through __reduce__).
        if self._trusted is None or (module, name) in TRUSTED_BY_DEFAULT or (module, name) in self._trusted:
            return super().find_class(module, name)
        if module == "torch":
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
        if module == "numpy.dtypes" and name.endswith("DType"):
            return super().find_class(module, name)
        raise UntrustedClassError(
            "the saved state names %s.%s, which a training state does not hold, so it was not loaded (it could run "
            "code). If you saved it yourself and trust the state's source, pass load(..., trusted_classes=[\"%s.%s\"]) "
            "or set %s=%s.%s (\"*\" trusts every class)" % (module, name, module, name, TRUSTED_CLASSES_ENV, module, name))

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 4 and pid[0] == _TENSOR_TAG):
            raise StateError("unknown persistent id in a saved state: %r" % (pid,))
        return self._make(pid[1], pid[2], pid[3])


class _Ref:
    """A saved tensor in the skeleton's first pass: its index, dtype, shape."""

    __slots__ = ("idx", "dtype", "shape")

    def __init__(self, idx, dtype, shape):
        self.idx, self.dtype, self.shape = idx, dtype, tuple(shape)


def _path(p):
    return "".join("[%r]" % k for k in p) or "the state"


class _Into:
    """Where load(into=...) puts each saved tensor: the caller's tensors at
    the same place in the structure (nested dicts, lists, tuples; an
    nn.Module or an optimizer stands for its state_dict()). Everything is
    checked before a byte is written: a saved tensor whose destination has
    another shape or dtype, or a destination tensor the save does not hold,
    is a StateError naming its place."""

    def __init__(self, into, skel):
        import torch

        self.torch = torch
        self.dests = {}  # tensor index -> [(path, tensor)]
        self.modules = []  # (path, module, saved sub-dict)
        self.optims = []  # (path, optimizer, saved sub-dict, its state_dict())
        try:
            self._walk(skel, into, ())
        except StateError as e:  # the caller's structure, not a damaged save (load() tells them apart)
            raise _Mismatch(str(e)) from None

    def _walk(self, skel, into, path):
        torch = self.torch
        if into is None:
            return
        if isinstance(into, torch.nn.Module):
            if not isinstance(skel, dict):
                raise StateError("load(into=...): %s is a module but the save holds a %s there" % (_path(path), type(skel).__name__))
            sd = into.state_dict()
            missing = [k for k in sd if k not in skel]
            extra = [k for k in skel if k not in sd]
            if missing or extra:
                raise StateError("load(into=...): the module at %s does not match the save: missing from the save %s, "
                                 "not in the module %s" % (_path(path), missing[:8], extra[:8]))
            self.modules.append((path, into, skel))
            into = sd
        elif isinstance(into, torch.optim.Optimizer):
            if not (isinstance(skel, dict) and isinstance(skel.get("state"), dict)
                    and isinstance(skel.get("param_groups"), list)):
                raise StateError("load(into=...): %s is an optimizer but the save holds no optimizer state_dict there" % _path(path))
            sd = into.state_dict()
            sizes = [len(g["params"]) for g in sd["param_groups"]]
            saved = [len(g.get("params", ())) for g in skel["param_groups"]]
            if sizes != saved:
                raise StateError("load(into=...): the optimizer at %s has param groups of %s parameters, the save %s"
                                 % (_path(path), sizes, saved))
            self.optims.append((path, into, skel, sd))
            into = sd["state"]
            skel = skel["state"]
            path = path + ("state",)
        if isinstance(skel, _Ref):
            if not isinstance(into, torch.Tensor):
                raise StateError("load(into=...): the save holds a tensor at %s, into holds a %s" % (_path(path), type(into).__name__))
            want = getattr(torch, skel.dtype, None)
            if into.dtype != want or tuple(into.shape) != skel.shape:
                raise StateError("load(into=...): %s: saved %s %s, into has %s %s (shape and dtype must match)"
                                 % (_path(path), skel.dtype, list(skel.shape), str(into.dtype).replace("torch.", ""), list(into.shape)))
            if into.layout != torch.strided:
                raise StateError("load(into=...): %s: a %s tensor; only dense (strided) tensors can be restored into" % (_path(path), into.layout))
            self.dests.setdefault(skel.idx, []).append((path, into))
        elif isinstance(into, torch.Tensor):
            raise StateError("load(into=...): into holds a tensor at %s, the save a %s" % (_path(path), type(skel).__name__))
        elif isinstance(into, dict):
            if not isinstance(skel, dict):
                raise StateError("load(into=...): into holds a dict at %s, the save a %s" % (_path(path), type(skel).__name__))
            for k, v in into.items():
                if k not in skel:
                    if _has_tensor(v, torch):
                        raise StateError("load(into=...): %s is not in the save" % _path(path + (k,)))
                    continue
                self._walk(skel[k], v, path + (k,))
        elif isinstance(into, (list, tuple)):
            if not isinstance(skel, (list, tuple)) or len(skel) != len(into):
                raise StateError("load(into=...): into holds a %s of %d at %s, the save a %s" % (
                    type(into).__name__, len(into), _path(path), type(skel).__name__ + (" of %d" % len(skel) if isinstance(skel, (list, tuple)) else "")))
            for i, (s, v) in enumerate(zip(skel, into)):
                self._walk(s, v, path + (i,))
        # Anything else in into (numbers, strings) is ignored: non-tensor
        # values come from the save.

    def direct(self, idx):
        """The caller's tensor whose memory can take the bytes as they are
        (CPU, contiguous, no conjugate or negative view bit), or None."""
        for _, t in self.dests.get(idx, ()):
            if t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg():
                return t
        return None

    def fill_rest(self, idx, src):
        """Copy src (the saved tensor) into the idx's other destinations."""
        torch = self.torch
        with torch.no_grad():
            for _, t in self.dests.get(idx, ()):
                if t is not src:
                    t.copy_(src)

    def finish(self, state_skel_result):
        """Hand non-tensor parts to the modules and optimizers given as into."""
        torch = self.torch
        for path, mod, saved in self.modules:
            sub = _at(state_skel_result, path)
            rest = {k: v for k, v in sub.items() if not isinstance(v, torch.Tensor)}
            if rest:  # e.g. a module's _extra_state
                mod.load_state_dict(rest, strict=False)
        for path, opt, saved, sd in self.optims:
            sub = _at(state_skel_result, path)
            filled = all(all(not isinstance(v, torch.Tensor) or k in sd["state"].get(pid, {})
                             for k, v in ps.items()) for pid, ps in sub["state"].items()) \
                and set(sub["state"]) == set(sd["state"])
            if not filled:
                # A fresh optimizer (no state yet): torch's own load, which
                # copies the state as it does after torch.load.
                opt.load_state_dict(sub)
                continue
            params = [p for g in opt.param_groups for p in g["params"]]
            for pid, ps in sub["state"].items():
                live = opt.state[params[pid]]
                for k, v in ps.items():
                    if not isinstance(v, torch.Tensor):
                        live[k] = v
            for g, sg in zip(opt.param_groups, sub["param_groups"]):
                for k, v in sg.items():
                    if k != "params":
                        g[k] = v


def _has_tensor(v, torch):
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, dict):
        return any(_has_tensor(x, torch) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_has_tensor(x, torch) for x in v)
    return isinstance(v, (torch.nn.Module, torch.optim.Optimizer))


def _at(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _decode(read, length, verify_crc=None, into=None, trusted=()):
    """Rebuild a state from a payload read through read = (pread(off, n) ->
    bytes, readmany([(address, off, n)]): n bytes at payload offset off to
    each address, in parallel). Returns the state; verify_crc, when
    given, is checked against the CRC-32 of every payload byte. With into
    (load(into=...)), saved tensors are read straight into the caller's
    tensors where the structure has one (_Into); the others are new."""
    pread, readmany = read
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
        r = metas.get(idx)
        if r is None:
            r = metas[idx] = _Ref(idx, dtype, shape)
        return r

    # First pass: the tensors' metadata in order (persistent ids are
    # produced in first-appearance order, as they were saved), and the
    # skeleton that into= is matched against.
    skel = _Unpickler(io.BytesIO(data[_PAYLOAD.size:start]), collect, trusted).load()
    if len(metas) != ntensors:
        raise StateError("state payload: %d tensors described, header says %d" % (len(metas), ntensors))
    dest = _Into(into, skel) if into is not None else None
    tensors = []
    off = len(data)
    if ntensors:
        import torch

        # Every destination first, then one parallel read of all the bytes
        # (_spread), then the CRC and the other destinations.
        todo = []
        for idx in range(ntensors):
            m = metas[idx]
            dt = getattr(torch, m.dtype, None)
            if not isinstance(dt, torch.dtype):
                raise StateError("state payload: unknown dtype %r" % m.dtype)
            t = dest.direct(idx) if dest is not None else None
            fresh = t is None
            if fresh:
                t = torch.empty(m.shape, dtype=dt)
            v = _cpu_view(t)
            if off + len(v) > length:
                raise StateError("state payload: tensor %d past the payload's end" % idx)
            todo.append((t, v, fresh))
            off += len(v) + _pad8(len(v))
        pieces, new, at = [], [], len(data)
        for t, v, fresh in todo:
            if len(v):
                (new if fresh else pieces).append((t.data_ptr(), at, len(v)))
            at += len(v) + _pad8(len(v))
        readmany(pieces)
        readmany(new, True)
        for idx, (t, v, _) in enumerate(todo):
            if check:
                if len(v):
                    crc = zlib.crc32(v, crc)
                if _pad8(len(v)):
                    crc = zlib.crc32(b"\0" * _pad8(len(v)), crc)
            if dest is not None:
                dest.fill_rest(idx, t)
                if idx in dest.dests and t is not dest.dests[idx][0][1]:
                    t = dest.dests[idx][0][1]  # the caller's tensor is the one returned
            tensors.append(t)
    if off != length:
        raise StateError("state payload: %d bytes described, %d stored" % (off, length))
    if check and crc != verify_crc:
        raise StateError("state payload: CRC %08x, saved %08x (corrupt or overwritten while read)" % (crc, verify_crc))
    out = _Unpickler(io.BytesIO(data[_PAYLOAD.size:start]), lambda i, d, s: tensors[i], trusted).load()
    if dest is not None:
        dest.finish(out)
    return out


def _pwrite_all(fd, b, off):
    done = 0
    while done < len(b):
        done += os.pwrite(fd, b[done:], off + done)


def _pwrite_bufs(fd, bufs, off):
    """Write bufs back to back at off; returns the CRC-32 of the bytes when
    crc is wanted (computed per buffer, from the same memory)."""
    for b in bufs:
        done = 0
        while done < len(b):
            done += os.pwrite(fd, b[done:], off + done)
        off += len(b)


def _crc_bufs(bufs, nthreads=1):
    """The CRC-32 (IEEE, zlib's) of bufs back to back. With nthreads > 1 the
    bytes are cut as a copy cuts them (_split) and each range's CRC is
    computed on its own thread (zlib releases the GIL), then combined: the
    same value as one pass, in about 1/N of its time where cores are idle."""
    ranges = _split(_pieces(bufs, 0), nthreads)
    if len(ranges) == 1:
        c = 0
        for b in bufs:
            c = zlib.crc32(b, c)
        return c
    crcs = [0] * len(ranges)

    def one(i):
        c = 0
        for _, a, n in ranges[i]:
            c = zlib.crc32(_buffer_at(a, n), c)
        crcs[i] = c

    _parallel([lambda i=i: one(i) for i in range(len(ranges))], nthreads)
    c = crcs[0]
    for i in range(1, len(ranges)):
        c = _crc32_combine(c, crcs[i], sum(p[2] for p in ranges[i]))
    return c


# crc32_combine as zlib 1.2.12 computes it (Python's zlib does not expose
# it): the CRC of A+B from crc(A), crc(B) and len(B), by multiplying crc(A)
# by x^(8 len(B)) modulo the CRC polynomial (reflected). A few microseconds.
_CRC_POLY = 0xEDB88320


def _multmodp(a, b):
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) mod p, for k = 0..31
for _k in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def _crc32_combine(crc1, crc2, len2):
    p, k, n = 1 << 31, 3, len2  # x^(8 len2) = x^(len2 2^3)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


def _preaders(fd, base, nthreads=1):
    def pread(off, n):
        b = os.pread(fd, n, base + off)
        if len(b) != n:
            raise StateError("state: short read (%d of %d bytes)" % (len(b), n))
        return b

    def preadinto(dst, off, n):
        v = _buffer_at(dst, n)
        done = 0
        while done < n:
            k = os.preadv(fd, [v[done:]], base + off + done)
            if k <= 0:
                raise StateError("state: short read")
            done += k

    return pread, lambda pieces, fresh=False: _spread(pieces, preadinto, nthreads)


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
        self.threaded = nthreads > 1 and _LOAD_POPULATE == "threads"
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
            _memmove(dst, at + off, n)

        def populate_memmove(dst, off, n):
            lo = (at + off) // page * page
            madvise(lo, at + off + n - lo, _MADV_POPULATE_READ)  # EINVAL before Linux 5.14: faults instead
            _memmove(dst, at + off, n)

        def populate_both(dst, off, n):
            # A new tensor's pages are faulted in one call per range, not
            # one fault per 4 KiB page during the copy.
            dlo = (dst + page - 1) // page * page
            dhi = (dst + n) // page * page
            if dhi > dlo:
                madvise(dlo, dhi - dlo, _MADV_POPULATE_WRITE)
            populate_memmove(dst, off, n)

        if self.threaded:
            return pread, lambda pieces, fresh=False: _spread(pieces, populate_both if fresh else populate_memmove, self.nthreads)

        return pread, lambda pieces, fresh=False: _spread(pieces, memmove, self.nthreads)

    def close(self):
        self.libc.munmap(self.addr, max(self.size, 1))


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


def _pinned(fd):
    """The seq of the save the launcher's writer is copying (0: none; a
    torn or damaged pin reads as none: the writer's own check covers it)."""
    b = os.pread(fd, _PIN.size + 4, PIN_OFF)
    if len(b) < _PIN.size:
        return 0
    seq, c = _PIN.unpack_from(b)
    return seq if seq and c == zlib.crc32(b[:8]) else 0


def _claim(fd, ds, newest):
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
        pin = _pinned(fd)
        target = 1 - newest
        if pin and ds[target] is not None and ds[target][0] == pin:
            target = newest
        raw = os.pread(fd, 64, DESC_OFF[target])
        os.pwrite(fd, zero, DESC_OFF[target])
        if ds[target] is None or _pinned(fd) != ds[target][0]:
            return target
        os.pwrite(fd, raw, DESC_OFF[target])  # pinned meanwhile: the writer copies it, untouched
    # The pin kept moving (not seen): the writer's check after its copy
    # sees the slot reused and copies the newest save again.
    target = 1 - newest
    os.pwrite(fd, zero, DESC_OFF[target])
    return target


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


_MADV_POPULATE_READ = 22
# How a load with more than one copy thread maps the slot: "threads" (each
# thread populates its own range; measured faster for new tensors, as fast
# for into=, docs/benchmarks-history.md "Parallel and overlapped save") or
# "map" (MAP_POPULATE, as one thread does). Kept for bench/state_threads_ab.py.
_LOAD_POPULATE = "threads"
_MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels: EINVAL, the pages fault in on first use instead


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
        either split across nthreads threads (_spread)."""
        pieces = _pieces(bufs, off)
        if off in self.warm:
            base = self.addr
            _spread([(base + d, a, n) for d, a, n in pieces], _memmove, nthreads)
            return
        fd = self.fd
        _spread(pieces, lambda d, a, n: _pwrite_all(fd, _buffer_at(a, n), d), nthreads)
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


class _Segment:
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
        ds = _slots(m.fd) if m is not None else [None, None]
        newest = _newest(ds)
        seq = 1 if newest is None else ds[newest][0] + 1
        crc = _crc_bufs(bufs, nthreads) if checksum else 0
        flags = FLAG_CRC if checksum else 0
        if newest is None or ds[newest][4] < length:
            old = m.size if m is not None else 0
            return self._grow(seq, step, bufs, length, crc, flags, nthreads, commit, old, rank)
        cap = ds[newest][4]
        if HEADER + 2 * cap > m.size:
            raise StateError("state segment %s: slots of %d bytes end at %d, past the segment's %d bytes"
                             % (self.path, cap, HEADER + 2 * cap, m.size))
        target = _claim(m.fd, ds, newest)  # the slot holds no save from here
        off = HEADER + target * cap
        m.write(bufs, off, cap, nthreads)
        dur = commit()
        # The commit goes through the kernel (its locked instructions order
        # it after the payload's stores, non-temporal ones included), so a
        # reader that sees the descriptor sees the payload.
        os.pwrite(m.fd, _desc_pack(seq, step, off, length, cap, dur, rank, crc, flags), DESC_OFF[target])
        return seq

    def _grow(self, seq, step, bufs, length, crc, flags, nthreads, commit, old, rank):
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
            _spread(_pieces(bufs, HEADER), lambda d, a, n: _pwrite_all(fd, _buffer_at(a, n), d), nthreads)
            dur = commit()
            os.pwrite(fd, _desc_pack(seq, step, HEADER, length, cap, dur, rank, crc, flags), DESC_OFF[0])
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
            d = _desc_unpack(raw)
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
        """The state of committed save d in slot i. Raises _Changed when the
        saver reused the slot while it was read, _Mismatch when into does
        not fit a save that is intact (UntrustedClassError when it names a
        class not trusted), StateError when the save is damaged
        (its CRC with verify and a saver's checksum; else the consistency
        of its payload)."""
        seq, step, off, length = d[:4]
        want = d[7] if (verify and d[8] & FLAG_CRC) else None
        view = _SlotView(fd, off, length, copy_threads())
        try:
            try:
                state = _decode(view.readers(), length, want, into, trusted)
            except (_Mismatch, UntrustedClassError):
                # The caller's structure or trust, not damage: unless the
                # save's CRC fails too (a flipped bit can rename a class).
                if _slots(fd)[i] != d:
                    raise _Changed() from None
                if want is not None and zlib.crc32(view.readers()[0](0, length)) != want:
                    raise StateError("payload CRC does not match the saver's %08x" % want) from None
                raise
            except Exception as e:
                if _slots(fd)[i] != d:
                    raise _Changed() from None
                if isinstance(e, StateError):
                    raise
                raise StateError("the payload does not decode: %r" % e) from e
        finally:
            view.close()
        if _slots(fd)[i] != d:  # overwritten while it was read
            raise _Changed()
        return state


class _Changed(Exception):
    """A slot was reused by its saver while it was read (read again)."""


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


def _save_file(d, step, bufs, length, commit, rank):
    """The launcher's write-out format, written by the rank: data file and
    manifest, each atomically (temporary file, fsync, rename, fsync dir)."""
    os.makedirs(d, exist_ok=True)
    old = _read_manifest(d, rank)
    seq = (old["seq"] if old else 0) + 1
    crc = _crc_bufs(bufs)
    # Not the launcher's rank-R-seq-Q name: a rank that saves to files (no
    # room in memory) beside the launcher's write-outs never overwrites one.
    name = "rank-%d-own-%d.ftstate" % (rank, seq)
    fd, tmp = tempfile.mkstemp(prefix=".ftstate-", suffix=".tmp", dir=d)
    try:
        _pwrite_bufs(fd, bufs, FILE_HEADER)
        dur = commit()
        hdr = _FILE_HDR.pack(FILE_MAGIC, FILE_VERSION, FLAG_CRC, step, length, crc, rank, seq, dur)
        _pwrite_all(fd, hdr + b"\0" * (FILE_HEADER - len(hdr)), 0)
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


def load_file(path, rank=None, verify=True, into=None, trusted_classes=None):
    """Load a written-out state: ``path`` is a state directory (the
    manifest of ``rank``, default $RANK or 0, names the file), a manifest
    (``rank-R.json``) or a data file (``.ftstate``). Returns (step, state);
    raises FileNotFoundError when there is none and StateError when the file
    is damaged (its length or CRC does not match, or the manifest names a
    step, length or CRC that its file does not hold). ``into``,
    ``trusted_classes``: as for load()."""
    m = None
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
        magic, ver, flags, step, length, crc, _, seq, _ = _FILE_HDR.unpack_from(hdr)
        if ver != FILE_VERSION:
            raise StateError("%s: state file version %d, this client reads %d" % (path, ver, FILE_VERSION))
        if m is not None and (m.get("step"), m.get("bytes"), m.get("crc32"), m.get("seq")) != (step, length, crc, seq):
            raise StateError("%s: the manifest names step %s, %s bytes, CRC %s, seq %s; the file holds step %d, %d bytes, "
                             "CRC %08x, seq %d (one of them is damaged)"
                             % (path, m.get("step"), m.get("bytes"), m.get("crc32"), m.get("seq"), step, length, crc, seq))
        size = os.fstat(fd).st_size
        if size != FILE_HEADER + length:
            raise StateError("%s: %d payload bytes, header says %d (truncated)" % (path, size - FILE_HEADER, length))
        return step, _decode(_preaders(fd, FILE_HEADER, copy_threads()), length, crc if verify else None, into, trusted_classes)
    finally:
        os.close(fd)


# -- the API ---------------------------------------------------------------


def save(step, state, monitor=None, checksum=True, path=None, overlap=False):
    """Save ``state`` (any picklable object; tensors anywhere in it are
    copied as raw bytes) as the state after ``step``.

    Under ft-launcher (--state-dir) it goes into the launcher's memory and
    blocks only for the copy (split across copy_threads() threads,
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
    nthreads = copy_threads()
    live = monitor is not None and getattr(monitor, "is_initialized", False)
    if live:
        monitor.start_section("checkpointing")
    try:
        start = time.perf_counter()
        wait()  # an overlapped save still in flight: this call waits for it
        if overlap:
            origins = []
            bufs, length, keep = _encode(state, origins)
            p = _Pending(step, state, origins, keep, length)
            p.call_secs = time.perf_counter() - start
            # Where it goes is fixed now: an in-process rejoin may change
            # LOCAL_RANK and RANK before the copy ends.
            p.future = _save_pool.get(1).submit(p.run, bufs, checksum, _state_dir(path), nthreads, _segment(), _rank())
            _pending[0] = p
            return {"step": step, "bytes": length, "seconds": p.call_secs, "where": "pending", "threads": nthreads}
        bufs, length, _keep = _encode(state)
        where = _store(step, bufs, length, checksum, _state_dir(path), nthreads, lambda: int((time.perf_counter() - start) * 1e9),
                       _segment(), _rank())
        secs = time.perf_counter() - start
    finally:
        if live:
            monitor.end_section("checkpointing")
    return {"step": step, "bytes": length, "seconds": secs, "where": where, "threads": nthreads}


def _store(step, bufs, length, checksum, d, nthreads, commit, seg, rank):
    """Write an encoded save to the launcher's segment seg (a _Segment or
    None), or to a file in directory d when there is none or it does not
    fit; returns "memory" or "file"."""
    try:
        if seg is None:
            raise _NoRoom("")
        seg.save(step, bufs, length, checksum, nthreads, commit, rank)
        return "memory"
    except _NoRoom as e:
        if seg is not None:
            # Once per process: every later save takes the same way.
            lvl = logging.DEBUG if _warned_no_room[0] else logging.WARNING
            _warned_no_room[0] = True
            log.log(lvl, "ft-launcher state: %s; saving to files in %s instead (this process's later saves too)",
                    e, d)
        _save_file(d, step, bufs, length, commit, rank)
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
            info["where"] = _store(self.step, bufs, self.length, checksum, d, nthreads, self.commit, seg, rank)
            info["committed"] = True
        except _Modified as e:
            place = _place(self.state, e.tensor)
            _overlap_refused[0] += 1
            lvl = logging.DEBUG if _overlap_refused[0] > 1 else logging.WARNING
            log.log(lvl, "ft-launcher state: the overlapped save of step %d was not committed: the tensor at %s "
                    "changed in place while it was copied (%d such saves in this process); the previous save stays "
                    "the newest. Call state.wait() (ctx.state.wait()) before optimizer.step() or any in-place change",
                    self.step, place, _overlap_refused[0])
            info.update(where=None, committed=False, modified=place)
        finally:
            self.keep = self.state = None
        info["copy_seconds"] = self.copy_secs
        return info


def _place(obj, t, path=()):
    """Where tensor t sits in obj (dicts, lists, tuples), as _path writes it."""
    if obj is t:
        return _path(path)
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
    p = _pending[0]
    if p is None:
        return None
    _pending[0] = None
    if p.pid != os.getpid():
        return None  # a forked child: the parent's save is the parent's to wait for
    p.wait_start = time.perf_counter()
    info = p.future.result()
    waited = time.perf_counter() - p.wait_start
    info.update(call_seconds=p.call_secs, wait_seconds=waited, seconds=p.call_secs + waited)
    return info


def load(path=None, verify=True, info=None, into=None, trusted_classes=None):
    """Return (step, state) of the newest save of this rank, or (None, None).

    Under ft-launcher the launcher's memory copy is read (a memory copy into
    new tensors); the written-out file of the state directory (``path`` /
    $FT_STATE_DIR / ./ft_state) is the fallback, and wins when it holds a
    newer step (a save that did not fit in memory). A save that is damaged
    (its CRC does not match, or its descriptor or payload is inconsistent)
    is passed over with a CorruptStateWarning (and a log warning, and the
    launcher's state_corrupt event): the next source by freshness is read
    instead (the older save in memory, the file); StateError only when no
    source is intact. Tensors come back on the CPU. A dict given as
    ``info`` receives "source" ("memory", "file" or None), "seconds" and
    "rejected" (the damaged sources passed over: source, slot, seq, step,
    error).

    ``into`` restores into tensors the caller already has: a structure
    shaped like the saved state (nested dicts, lists, tuples) holding
    tensors, ``nn.Module``s or optimizers where the save holds tensors or
    their state_dicts, e.g. ``into={"model": model, "opt": opt}`` for a
    save of ``{"model": model.state_dict(), "opt": opt.state_dict()}``.
    Each saved tensor that has a destination is read straight into it (no
    new memory, no second copy by load_state_dict); the rest come back new.
    A destination of another shape or dtype, or one the save does not hold,
    raises StateError before anything is written. The state returned holds
    the caller's tensors where they were filled. A module's other entries
    (``_extra_state``) and an optimizer's hyperparameters and non-tensor
    state are set too; an optimizer without state yet (a fresh process) is
    loaded with its own ``load_state_dict``. A damaged save found after
    writing began (a CRC mismatch) is overwritten by the older source's
    values; if no source is intact, the destinations hold partly restored
    values: start over.

    ``trusted_classes``: classes or functions (or "module.name" strings)
    the state may name beyond plain training data (TRUSTED_BY_DEFAULT), e.g.
    a dataclass of your own; "*" trusts everything. A state that names any
    other raises UntrustedClassError before any of it runs (no fallback to
    an older source: it is the caller's trust, not damage, unless the
    save's CRC fails too). The same opt-in for every load of the process:
    $FT_STATE_TRUSTED_CLASSES."""
    return _load(path, verify, info, into=into, trusted_classes=trusted_classes)


def _load(path=None, verify=True, info=None, note=None, into=None, trusted_classes=None):
    """load(), with note's fields added to the restore note (heal.py)."""
    wait()
    start = time.perf_counter()
    rejected = []
    try:
        step, st, source = _restore(_segment(), _state_dir(path), _rank(), verify, into, rejected,
                                     trusted_classes)
    except StateError:
        if rejected:  # no source intact: the launcher hears of each all the same
            _warn_rejected(rejected, None, None)
            _note_restore(None, None, time.perf_counter() - start, rejected=rejected, **(note or {}))
        raise
    secs = time.perf_counter() - start
    if rejected:
        _warn_rejected(rejected, step, source)
    if info is not None:
        info["source"] = source
        info["seconds"] = secs
        info["rejected"] = rejected
    extra = dict(note or {})
    if rejected:
        extra["rejected"] = rejected
    _note_restore(step, source, secs, **extra)
    return step, st


def _restore(seg, d, rank, verify, into, rejected, trusted=None):
    """(step, state, source) from the newest source that is intact: the
    segment's saves newest first, and the state directory's file before
    every save in memory of a lower step (a save that fell back to a
    file, or a memory emptied by a new job). A damaged source (its CRC,
    or its descriptor and payload inconsistent) is added to rejected and
    the next one tried; when no source is intact, StateError names each.
    A save reused by its saver while it was read is read again."""
    errors = []
    try:
        m = _read_manifest(d, rank) if os.path.isdir(d) else None
    except Exception as e:  # a damaged manifest: memory may still be intact
        rejected.append({"source": "file", "seq": None, "step": None, "error": "manifest: %s" % (str(e) or repr(e))})
        errors.append(e)
        m = None
    file_done = m is None

    def from_file():
        try:
            step, st = load_file(d, rank=rank, verify=verify, into=into, trusted_classes=trusted)
        except (_Mismatch, UntrustedClassError) as e:
            if not (verify and _file_damaged(d, m)):
                raise
            rejected.append({"source": "file", "seq": m.get("seq"), "step": m.get("step"), "error": "%s (and its CRC fails)" % e})
            errors.append(e)
            return None
        except Exception as e:  # a damaged or unreadable file: the next source (an unpickling error included)
            rejected.append({"source": "file", "seq": m.get("seq"), "step": m.get("step"), "error": str(e) or repr(e)})
            errors.append(e)
            return None
        return step, st, "file"

    fd = seg.open() if seg is not None else None
    damaged = []  # the last scan's damaged descriptors
    try:
        if fd is not None:
            bad = set()  # seqs found damaged
            for _ in range(8):
                again = False
                del damaged[:]
                for i, dsc in seg.saves(fd, damaged):
                    if dsc[0] in bad:
                        continue
                    if not file_done and m["step"] > dsc[1]:
                        file_done = True
                        got = from_file()
                        if got is not None:
                            return got
                    try:
                        return dsc[1], seg.read(fd, i, dsc, verify, into, trusted), "memory"
                    except _Changed:
                        again = True
                        break
                    except (_Mismatch, UntrustedClassError):
                        raise
                    except StateError as e:
                        bad.add(dsc[0])
                        rejected.append({"source": "memory", "slot": i, "seq": dsc[0], "step": dsc[1],
                                         "error": "%s" % e})
                        errors.append(e)
                if not again:
                    break
            else:
                raise StateError("state segment %s: overwritten 8 times while being read" % seg.path)
    finally:
        if fd is not None:
            os.close(fd)
        rejected[:0] = damaged
    if not file_done:
        got = from_file()
        if got is not None:
            return got
    if errors:
        raise StateError("no intact saved state: %s" % "; ".join(_describe(r) for r in rejected)) from errors[0]
    return None, None, None


def _file_damaged(d, m):
    """Whether the data file m names fails the CRC in its header."""
    try:
        fd = os.open(os.path.join(d, m["file"]), os.O_RDONLY)
    except (OSError, KeyError, TypeError):
        return True
    try:
        hdr = os.pread(fd, FILE_HEADER, 0)
        if len(hdr) < FILE_HEADER:
            return True
        want = _FILE_HDR.unpack_from(hdr)[5]
        c, off = 0, FILE_HEADER
        while True:
            b = os.pread(fd, 8 << 20, off)
            if not b:
                return c != want
            c, off = zlib.crc32(b, c), off + len(b)
    finally:
        os.close(fd)


def _describe(r):
    where = "the file" if r["source"] == "file" else "memory slot %s" % r.get("slot")
    what = "save %s (step %s)" % (r["seq"], r["step"]) if r.get("seq") is not None else "a save"
    return "%s in %s: %s" % (what, where, r["error"])


def _warn_rejected(rejected, step, source):
    """A warning (Python's warnings and the log) for each damaged source
    load() passed over; the restore note carries them to the launcher."""
    instead = "restored step %s from %s instead" % (step, source) if source else "nothing else to restore"
    for r in rejected:
        msg = "ft-launcher state: passed over a damaged save: %s; %s" % (_describe(r), instead)
        log.warning(msg)
        warnings.warn(msg, CorruptStateWarning, stacklevel=4)


def heal(step, state, groups=None, info=None, **kw):
    """Peer heal after an in-process rejoin: ft_launcher_client.heal.heal
    (docs/state.md, "Peer heal")."""
    from . import heal as _heal

    wait()
    return _heal.heal(step, state, groups=groups, info=info, **kw)


_warned_no_room = [False]  # a save that did not fit was logged (save)
_pending = [None]  # the overlapped save in flight (_Pending), at most one
_overlap_refused = [0]  # overlapped saves refused for an in-place change (save)
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
        wait()
        return _heal.heal(step, state, groups=groups, info=info, **kw)

    def save(self, step, state, checksum=True, path=None, overlap=False):
        m = self._monitor() if callable(self._monitor) else self._monitor
        return save(step, state, monitor=m, checksum=checksum, path=path, overlap=overlap)

    def wait(self):
        """state.wait(): the overlapped save in flight, committed or refused."""
        return wait()

    def load(self, path=None, verify=True, info=None, into=None, trusted_classes=None):
        return load(path=path, verify=verify, info=info, into=into, trusted_classes=trusted_classes)
