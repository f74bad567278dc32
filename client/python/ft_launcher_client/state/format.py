"""The bytes of a save, the same in memory, in a file and on the wire.

What the launcher's Go side reads too (state/layout.go, state/file.go:
both sides must agree): the segment's header, its two slot descriptors
and the writer's pin; the written-out file's header; and the payload both
hold: a skeleton (the pickled containers around the tensors) followed by
each tensor's raw bytes, with the CRC-32 that vouches for them. The
skeleton is read by a restricted unpickler that admits only what a
training state holds (TRUSTED_BY_DEFAULT), so a state from a launcher's
memory, a buddy, a peer or a file runs no code unless the caller trusts
its classes. Standard library only; torch only when the state holds
tensors (and never imported here).
"""

import io
import os
import pickle
import struct
import sys
import zlib

from . import copying
from .common import TRUSTED_CLASSES_ENV, StateError, UntrustedClassError, pad8
from .into import Into, Ref

# Segment layout: state/layout.go (both sides must agree).
MAGIC = b"FTSHM001"
HEADER = 4096
DESC_OFF = (64, 128)
FLAG_CRC = 1
# The launcher's writer pins the save it is copying to a file (16 bytes at
# PIN_OFF: that save's seq u64, the CRC-32 of those 8 bytes u32, zero u32);
# a saver leaves the pinned slot alone while it can (segment.claim).
PIN_OFF = 192
PIN = struct.Struct("<QI")
# In a written-out file's flags: the CRC is the one the saver computed,
# checked against the payload before the file was written (the launcher's
# writer); without it the CRC was computed when the file was written.
FLAG_SAVE_CRC = 2
_DESC = struct.Struct("<QqQQQQiII")  # seq step off len cap dur_ns rank payload_crc flags; + u32 own crc

# Written-out file: state/file.go.
FILE_MAGIC = b"FTSTATE1"
FILE_HEADER = 64
FILE_VERSION = 1
MANIFEST_FORMAT = "ft-launcher-state/1"
FILE_HDR = struct.Struct("<8sIIqQIiQQ")  # magic ver flags step len crc rank seq dur_ns (56 of 64 bytes)

# Payload: magic, skeleton length, tensor count, skeleton pickle, zero pad
# to 8, then each tensor's bytes, each padded to 8.
_PAYLOAD = struct.Struct("<8sQQ")
_PAYLOAD_MAGIC = b"FTPAYLD1"
_TENSOR_TAG = "ftstate.tensor"


def desc_pack(seq, step, off, length, cap, dur, rank, crc, flags):
    """A slot descriptor's 64 bytes, its own CRC-32 last."""
    b = _DESC.pack(seq, step, off, length, cap, dur, rank, crc, flags)
    return b + struct.pack("<I", zlib.crc32(b))


def desc_unpack(b):
    """A descriptor's fields (seq, step, off, len, cap, dur_ns, rank,
    payload_crc, flags), or None when it names no save (zero, or its CRC
    or fields do not hold)."""
    if len(b) < 64 or struct.unpack_from("<I", b, 60)[0] != zlib.crc32(b[:60]):
        return None
    d = _DESC.unpack_from(b)
    seq, step, off, length, cap = d[:5]
    if seq == 0 or length > cap or off < HEADER:
        return None
    return d


# -- the payload: skeleton and tensors ---------------------------------------


class Pickler(pickle.Pickler):
    """Pickles a state's skeleton; each tensor becomes a reference (its
    index, dtype, shape) and is appended, contiguous on the CPU, to tensors."""

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


def encode(state, origins=None):
    """(buffers, total length, tensors): the payload as a list of writable
    buffers written in order, the tensors' own memory among them (no copy).
    origins, a list, receives each saved tensor as found in state whose own
    memory the buffers hold (CPU, contiguous)."""
    tensors = []
    f = io.BytesIO()
    Pickler(f, tensors, origins).dump(state)
    skel = f.getvalue()
    head = bytearray(_PAYLOAD.pack(_PAYLOAD_MAGIC, len(skel), len(tensors)) + skel)
    head += b"\0" * pad8(len(head))
    bufs = [memoryview(head)]
    n = len(head)
    for t in tensors:
        v = copying.cpu_view(t)
        bufs.append(v)
        n += len(v)
        if pad8(len(v)):
            bufs.append(memoryview(bytearray(pad8(len(v)))))
            n += pad8(len(v))
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


class Unpickler(pickle.Unpickler):
    """Reads a skeleton Pickler wrote: each tensor reference is make(index,
    dtype, shape); a global outside TRUSTED_BY_DEFAULT and trusted (the
    caller's, and $FT_STATE_TRUSTED_CLASSES) is an UntrustedClassError."""

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


def decode(read, length, verify_crc=None, into=None, trusted=()):
    """Rebuild a state from a payload read through read = (pread(off, n) ->
    bytes, readmany([(address, off, n)]): n bytes at payload offset off to
    each address, in parallel). Returns the state; verify_crc, when
    given, is checked against the CRC-32 of every payload byte. With into
    (load(into=...)), saved tensors are read straight into the caller's
    tensors where the structure has one (into.Into); the others are new."""
    pread, readmany = read
    head = pread(0, _PAYLOAD.size)
    magic, skel_len, ntensors = _PAYLOAD.unpack(head)
    if magic != _PAYLOAD_MAGIC:
        raise StateError("not an ft-launcher state payload (magic %r)" % magic)
    if _PAYLOAD.size + skel_len > length:
        raise StateError("state payload: skeleton of %d bytes past the payload's %d" % (skel_len, length))
    start = _PAYLOAD.size + skel_len
    data = pread(0, start + pad8(start))
    check = verify_crc is not None
    crc = zlib.crc32(data) if check else 0
    metas = {}

    def collect(idx, dtype, shape):
        r = metas.get(idx)
        if r is None:
            r = metas[idx] = Ref(idx, dtype, shape)
        return r

    # First pass: the tensors' metadata in order (persistent ids are
    # produced in first-appearance order, as they were saved), and the
    # skeleton that into= is matched against.
    skel = Unpickler(io.BytesIO(data[_PAYLOAD.size:start]), collect, trusted).load()
    if len(metas) != ntensors:
        raise StateError("state payload: %d tensors described, header says %d" % (len(metas), ntensors))
    dest = Into(into, skel) if into is not None else None
    tensors = []
    off = len(data)
    if ntensors:
        import torch

        # Every destination first, then one parallel read of all the bytes
        # (copying.spread), then the CRC and the other destinations.
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
            v = copying.cpu_view(t)
            if off + len(v) > length:
                raise StateError("state payload: tensor %d past the payload's end" % idx)
            todo.append((t, v, fresh))
            off += len(v) + pad8(len(v))
        pieces, new, at = [], [], len(data)
        for t, v, fresh in todo:
            if len(v):
                (new if fresh else pieces).append((t.data_ptr(), at, len(v)))
            at += len(v) + pad8(len(v))
        readmany(pieces)
        readmany(new, True)
        for idx, (t, v, _) in enumerate(todo):
            if check:
                if len(v):
                    crc = zlib.crc32(v, crc)
                if pad8(len(v)):
                    crc = zlib.crc32(b"\0" * pad8(len(v)), crc)
            if dest is not None:
                dest.fill_rest(idx, t)
                if idx in dest.dests and t is not dest.dests[idx][0][1]:
                    t = dest.dests[idx][0][1]  # the caller's tensor is the one returned
            tensors.append(t)
    if off != length:
        raise StateError("state payload: %d bytes described, %d stored" % (off, length))
    if check and crc != verify_crc:
        raise StateError("state payload: CRC %08x, saved %08x (corrupt or overwritten while read)" % (crc, verify_crc))
    out = Unpickler(io.BytesIO(data[_PAYLOAD.size:start]), lambda i, d, s: tensors[i], trusted).load()
    if dest is not None:
        dest.finish(out)
    return out


def crc_bufs(bufs, nthreads=1):
    """The CRC-32 (IEEE, zlib's) of bufs back to back. With nthreads > 1 the
    bytes are cut as a copy cuts them (copying.split) and each range's CRC is
    computed on its own thread (zlib releases the GIL), then combined: the
    same value as one pass, in about 1/N of its time where cores are idle."""
    ranges = copying.split(copying.pieces(bufs, 0), nthreads)
    if len(ranges) == 1:
        c = 0
        for b in bufs:
            c = zlib.crc32(b, c)
        return c
    crcs = [0] * len(ranges)

    def one(i):
        c = 0
        for _, a, n in ranges[i]:
            c = zlib.crc32(copying.buffer_at(a, n), c)
        crcs[i] = c

    copying.parallel([lambda i=i: one(i) for i in range(len(ranges))], nthreads)
    c = crcs[0]
    for i in range(1, len(ranges)):
        c = crc32_combine(c, crcs[i], sum(p[2] for p in ranges[i]))
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


def crc32_combine(crc1, crc2, len2):
    p, k, n = 1 << 31, 3, len2  # x^(8 len2) = x^(len2 2^3)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2
