"""load(): the newest intact save of this rank, from wherever it is.

The sources, by freshness: the segment's two slots (segment.py), newest
first, and the state directory's file (files.py), read before every save
in memory of a lower step. A damaged source (its CRC, or its descriptor
and payload inconsistent) is passed over with a CorruptStateWarning and
the next one read. Every load leaves the launcher a restore note (where it
came from, what was passed over), which the launcher turns into its
state_restore event; the peer heal (peerheal.py) loads through
load_noted() and writes its own notes with note_restore(), so that its
restores are reported the same way.
"""

import json
import os
import time
import warnings

from .common import SHM_DIR_ENV, CorruptStateWarning, Mismatch, StateError, UntrustedClassError, log, this_rank
from .files import file_damaged, load_file, read_manifest, state_dir
from .saving import wait
from .segment import Changed, rank_segment

_notes = [0]  # restore notes written by this process (their names' counter)


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
    return load_noted(path, verify, info, into=into, trusted_classes=trusted_classes)


def load_noted(path=None, verify=True, info=None, note=None, into=None, trusted_classes=None):
    """load(), with note's fields added to the restore note (peerheal.py)."""
    wait()
    start = time.perf_counter()
    rejected = []
    try:
        step, st, source = _restore(rank_segment(), state_dir(path), this_rank(), verify, into, rejected,
                                     trusted_classes)
    except StateError:
        if rejected:  # no source intact: the launcher hears of each all the same
            _warn_rejected(rejected, None, None)
            note_restore(None, None, time.perf_counter() - start, rejected=rejected, **(note or {}))
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
    note_restore(step, source, secs, **extra)
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
        m = read_manifest(d, rank) if os.path.isdir(d) else None
    except Exception as e:  # a damaged manifest: memory may still be intact
        rejected.append({"source": "file", "seq": None, "step": None, "error": "manifest: %s" % (str(e) or repr(e))})
        errors.append(e)
        m = None
    file_done = m is None

    def from_file():
        try:
            step, st = load_file(d, rank=rank, verify=verify, into=into, trusted_classes=trusted)
        except (Mismatch, UntrustedClassError) as e:
            if not (verify and file_damaged(d, m)):
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
                    except Changed:
                        again = True
                        break
                    except (Mismatch, UntrustedClassError):
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


def note_restore(step, source, secs, **extra):
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
    body = {"local_rank": lr, "rank": this_rank(), "step": step, "source": source, "load_ms": secs * 1e3,
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
