"""The state directory: written-out saves and their manifests.

--state-dir (or $FT_STATE_DIR, or ./ft_state without ft-launcher) holds,
per rank, a data file in the written-out format (format.py's file header,
then the payload) and a manifest, rank-R.json, naming the newest one. The
launcher's writer fills it from the segment in the background; a rank
writes it itself when there is no launcher or the segment would not fit
in memory (each file atomically: temporary file, fsync, rename, fsync of
the directory); load() falls back to it and load_file() reads one
anywhere. Both sides read the same format (state/file.go).
"""

import json
import os
import tempfile
import time
import zlib

from . import copying
from .common import DEFAULT_DIR, DIR_ENV, StateError, this_rank
from .format import FILE_HDR, FILE_HEADER, FILE_MAGIC, FILE_VERSION, FLAG_CRC, MANIFEST_FORMAT, crc_bufs, decode


def state_dir(path=None):
    """The state directory: path, else $FT_STATE_DIR, else ./ft_state."""
    return path or os.environ.get(DIR_ENV) or DEFAULT_DIR


def _fsync_dir(d):
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(d, rank):
    try:
        with open(os.path.join(d, "rank-%d.json" % rank)) as f:
            m = json.load(f)
    except FileNotFoundError:
        return None
    if m.get("format") != MANIFEST_FORMAT:
        raise StateError("state manifest in %s: format %r, want %r" % (d, m.get("format"), MANIFEST_FORMAT))
    return m


def save_file(d, step, bufs, length, commit, rank):
    """The launcher's write-out format, written by the rank: data file and
    manifest, each atomically (temporary file, fsync, rename, fsync dir)."""
    os.makedirs(d, exist_ok=True)
    old = read_manifest(d, rank)
    seq = (old["seq"] if old else 0) + 1
    crc = crc_bufs(bufs)
    # Not the launcher's rank-R-seq-Q name: a rank that saves to files (no
    # room in memory) beside the launcher's write-outs never overwrites one.
    name = "rank-%d-own-%d.ftstate" % (rank, seq)
    fd, tmp = tempfile.mkstemp(prefix=".ftstate-", suffix=".tmp", dir=d)
    try:
        pwrite_bufs(fd, bufs, FILE_HEADER)
        dur = commit()
        hdr = FILE_HDR.pack(FILE_MAGIC, FILE_VERSION, FLAG_CRC, step, length, crc, rank, seq, dur)
        copying.pwrite_all(fd, hdr + b"\0" * (FILE_HEADER - len(hdr)), 0)
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


def pwrite_bufs(fd, bufs, off):
    """Write bufs back to back at off (the tests slow it down to catch a
    tensor changed during an overlapped save to a file)."""
    for b in bufs:
        done = 0
        while done < len(b):
            done += os.pwrite(fd, b[done:], off + done)
        off += len(b)


def _preaders(fd, base, nthreads=1):
    """format.decode's (pread, readmany) for a payload at base in fd."""
    def pread(off, n):
        b = os.pread(fd, n, base + off)
        if len(b) != n:
            raise StateError("state: short read (%d of %d bytes)" % (len(b), n))
        return b

    def preadinto(dst, off, n):
        v = copying.buffer_at(dst, n)
        done = 0
        while done < n:
            k = os.preadv(fd, [v[done:]], base + off + done)
            if k <= 0:
                raise StateError("state: short read")
            done += k

    return pread, lambda pieces, fresh=False: copying.spread(pieces, preadinto, nthreads)


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
        r = this_rank() if rank is None else rank
        m = read_manifest(path, r)
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
        magic, ver, flags, step, length, crc, _, seq, _ = FILE_HDR.unpack_from(hdr)
        if ver != FILE_VERSION:
            raise StateError("%s: state file version %d, this client reads %d" % (path, ver, FILE_VERSION))
        if m is not None and (m.get("step"), m.get("bytes"), m.get("crc32"), m.get("seq")) != (step, length, crc, seq):
            raise StateError("%s: the manifest names step %s, %s bytes, CRC %s, seq %s; the file holds step %d, %d bytes, "
                             "CRC %08x, seq %d (one of them is damaged)"
                             % (path, m.get("step"), m.get("bytes"), m.get("crc32"), m.get("seq"), step, length, crc, seq))
        size = os.fstat(fd).st_size
        if size != FILE_HEADER + length:
            raise StateError("%s: %d payload bytes, header says %d (truncated)" % (path, size - FILE_HEADER, length))
        return step, decode(_preaders(fd, FILE_HEADER, copying.copy_threads()), length, crc if verify else None, into, trusted_classes)
    finally:
        os.close(fd)


def file_damaged(d, m):
    """Whether the data file m names fails the CRC in its header."""
    try:
        fd = os.open(os.path.join(d, m["file"]), os.O_RDONLY)
    except (OSError, KeyError, TypeError):
        return True
    try:
        hdr = os.pread(fd, FILE_HEADER, 0)
        if len(hdr) < FILE_HEADER:
            return True
        want = FILE_HDR.unpack_from(hdr)[5]
        c, off = 0, FILE_HEADER
        while True:
            b = os.pread(fd, 8 << 20, off)
            if not b:
                return c != want
            c, off = zlib.crc32(b, c), off + len(b)
    finally:
        os.close(fd)
