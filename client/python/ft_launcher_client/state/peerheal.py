"""Peer heal for in-process restarts (docs/state.md, "Peer heal"); its
public name, and its usage, are ft_launcher_client.heal's.

After an in-process rejoin every rank of the new round agrees, through
the round's store, on the last step the survivors completed (decide()),
and a survivor sends its live state to its group's replacement(s) over the
new process group (transport.py); when they disagree, or a group lost
every member, every rank falls back to its newest committed save
(restore.load_noted), and says so in its restore note.

It lives in the state package, above the modules it uses (restore.py for
the fallback load and the restore note, transport.py for the transfer),
so that state.heal() and ctx.state.heal() (bound.py) call it without an
import cycle. Standard library only at import; torch when a process group
is there.
"""

import json
import logging
import os
import time

from .restore import load_noted, note_restore
from .transport import recv, send

# The logger of the module users know it by (ft_launcher_client.heal).
log = logging.getLogger("ft_launcher_client.heal")

KEY_PREFIX = "ft_heal"
DEFAULT_TIMEOUT = 300.0  # seconds a rank waits for its peers' reports

# What heal did, in info["heal"] and the restore note.
PEER = "peer"  # the replacement(s) received a survivor's state
KEPT = "kept"  # every rank held the state: nothing was sent
LOAD = "load"  # no rank held a live state (first round, full restart): load()
FALLBACK = "fallback"  # live states that cannot be used: load(), and why


def check_groups(groups, world):
    """The replica groups as a list of sorted lists; None means one group
    of every rank (plain data parallelism). Raises ValueError naming the
    problem: a rank outside 0..world-1, a rank in two groups."""
    if groups is None:
        return [list(range(world))]
    out, seen = [], {}
    for i, g in enumerate(groups):
        try:
            g = sorted(int(r) for r in g)
        except (TypeError, ValueError):
            raise ValueError("replica group %d (%r): want a list of ranks (ints)" % (i, g)) from None
        for r in g:
            if not 0 <= r < world:
                raise ValueError("replica group %d names rank %d; ranks are 0..%d (world size %d)" % (i, r, world - 1, world))
            if r in seen:
                raise ValueError("rank %d is in replica groups %d and %d; a rank holds one state, in one group" % (r, seen[r], i))
            seen[r] = i
        out.append(g)
    for r in range(world):  # a rank not named is a group of its own (no replica)
        if r not in seen:
            out.append([r])
    return out


def _ranks_text(ranks, most=8):
    ranks = sorted(ranks)
    s = ", ".join(str(r) for r in ranks[:most])
    return s + (", ... (%d ranks)" % len(ranks) if len(ranks) > most else "")


def decide(steps, world, groups=None):
    """The heal's decision from every rank's report: ``steps`` maps each
    rank to the last step it completed, None when it holds no live state.
    Pure (no torch, no store), so that every rank would decide alike; rank
    0 decides and publishes it. Returns a dict: mode (peer, kept, load,
    fallback), step (the step healed; None unless peer or kept), why (a
    sentence), sources ({replacement rank: the survivor that sends it its
    state}, as strings for JSON)."""
    groups = check_groups(groups, world)
    missing = [r for r in range(world) if r not in steps]
    if missing:
        raise ValueError("heal: no report from ranks %s" % _ranks_text(missing))
    holders = {r: s for r, s in steps.items() if s is not None}
    if not holders:
        return {"mode": LOAD, "step": None, "why": "no rank holds a live state", "sources": {}}
    by_step = {}
    for r, s in holders.items():
        by_step.setdefault(s, []).append(r)
    if len(by_step) > 1:
        parts = ["step %d on ranks %s" % (s, _ranks_text(rs)) for s, rs in sorted(by_step.items())]
        return {"mode": FALLBACK, "step": None, "sources": {},
                "why": "the survivors disagree on the last completed step (%s)" % "; ".join(parts)}
    (step,) = by_step
    sources = {}
    for g in groups:
        have = [r for r in g if r in holders]
        lost = [r for r in g if r not in holders]
        if not lost:
            continue
        if not have:
            return {"mode": FALLBACK, "step": None, "sources": {},
                    "why": "replica group [%s] has no survivor (ranks %s hold no live state)" % (_ranks_text(g), _ranks_text(lost))}
        for r in lost:
            sources[str(r)] = min(have)
    return {"mode": PEER if sources else KEPT, "step": step, "sources": sources,
            "why": ("ranks %s receive step %d from a survivor" % (_ranks_text(int(r) for r in sources), step)) if sources
            else "every rank holds step %d" % step}


# -- the API ----------------------------------------------------------------

_calls = {}  # round -> heal calls of this process in it (their store keys)


def heal(step, state, groups=None, info=None, timeout=DEFAULT_TIMEOUT, path=None, verify=True, step_at=None):
    """Return (step, state) for this rank of the new round.

    ``step``/``state``: a survivor's last completed step and its live state
    (any object ``state.save`` takes); a replacement rank passes None,
    None. Every rank of the round must call it, the same number of times.
    ``groups``: lists of ranks that hold the same state (replicas); None:
    every rank is a replica (data parallelism). A rank in no group has no
    replica. The survivors get their own ``state`` back (the same object);
    a replacement gets a copy of its group's lowest surviving rank's state
    (tensors on the CPU, as load() returns them). On a fallback or with no
    live state anywhere, every rank gets ``state.load(path, verify)``.
    ``info`` (a dict) receives heal (peer, kept, load, fallback), source
    (live, peer, memory, file, None), why, step, seconds, bytes, from_rank.
    A peer that dies during the heal fails it with torch's RuntimeError,
    which InProcess.run handles as a failed collective (the next rejoin).
    ``step_at``: when this survivor completed ``step`` (epoch seconds, or a
    callable returning them; ``ctx.state.heal`` passes the time of the last
    ``ctx.step()``): the report counts the time after it as lost."""
    info = {} if info is None else info
    start = time.perf_counter()
    live = None if state is None or step is None else int(step)
    try:
        import torch.distributed as dist

        up = dist.is_available() and dist.is_initialized()
    except ImportError:
        up = False
    if not up or dist.get_world_size() == 1:
        if live is not None:
            info.update(heal=KEPT, source="live", why="no process group: nothing to heal", step=live,
                        seconds=time.perf_counter() - start, bytes=0, from_rank=None)
            return live, state
        return _load(info, start, LOAD, "no process group and no live state", path, verify)

    from torch.distributed import distributed_c10d as c10d

    rank, world = dist.get_rank(), dist.get_world_size()
    groups = check_groups(groups, world)  # bad input fails every rank alike, before the store
    rnd = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    n = _calls.get(rnd, 0)
    _calls[rnd] = n + 1
    store = c10d._get_default_store()
    base = "%s/%d/" % (KEY_PREFIX, n)
    wait = _timedelta(timeout)
    store.set(base + "rank/%d" % rank, json.dumps({"step": live}))
    if rank == 0:
        keys = [base + "rank/%d" % r for r in range(world)]
        store.wait(keys, wait)
        steps = {r: json.loads(store.get(k))["step"] for r, k in enumerate(keys)}
        d = decide(steps, world, groups)
        store.set(base + "decision", json.dumps(d))
    else:
        store.wait([base + "decision"], wait)
        d = json.loads(store.get(base + "decision"))
    mode, why = d["mode"], d["why"]
    if mode in (LOAD, FALLBACK):
        if mode == FALLBACK:
            log.warning("peer heal: %s; every rank restores its newest committed save instead", why)
        return _load(info, start, mode, why, path, verify)

    healed = d["step"]
    sources = {int(k): v for k, v in d["sources"].items()}
    nbytes, frm = 0, None
    if rank in sources:
        frm = sources[rank]
        state, nbytes = recv(dist, frm)
        source = PEER
    else:
        dsts = sorted(r for r, s in sources.items() if s == rank)
        if dsts:
            nbytes = send(dist, state, dsts)
        source = "live"
    secs = time.perf_counter() - start
    info.update(heal=mode, source=source, why=why, step=healed, seconds=secs, bytes=nbytes, from_rank=frm)
    extra = {"heal": mode, "bytes": nbytes}
    if frm is not None:
        extra["from_rank"] = frm
    at = step_at() if callable(step_at) else step_at
    if source == "live" and at:
        extra["step_at"] = _iso(at)  # when the healed step ended here: the report's end of the productive time
    note_restore(healed, source, secs, **extra)
    if frm is not None:
        log.info("peer heal: received step %d (%d bytes) from rank %d in %.3f s", healed, nbytes, frm, secs)
    return healed, state


def _load(info, start, mode, why, path, verify):
    got = {}
    step, st = load_noted(path=path, verify=verify, info=got, note={"heal": mode, "why": why})
    info.update(heal=mode, source=got.get("source"), why=why, step=step, seconds=time.perf_counter() - start,
                bytes=0, from_rank=None)
    return step, st


def _iso(epoch):
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat()


def _timedelta(seconds):
    import datetime

    if isinstance(seconds, datetime.timedelta):
        return seconds
    return datetime.timedelta(seconds=float(seconds))


__all__ = ["heal", "decide", "check_groups", "PEER", "KEPT", "LOAD", "FALLBACK"]
