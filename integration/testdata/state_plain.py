#!/usr/bin/python3
"""A rank whose whole state is a small dict (no torch: starts in
milliseconds) kept in ft-launcher's memory with ft_launcher_client.state;
integration/state_test.go's replication tests with many nodes.

Step s adds rank * 1000 + s to an accumulator; the state (rank, step,
accumulator, and a few KiB of bytes derived from both) is saved after
every step. At start the rank loads its newest save and goes on from the
next step, so the final accumulator equals an uninterrupted run's only if
what it loaded was its own rank's newest save.

--hold-at-step H: in round 0 every rank, right after its save of step H,
writes $OUT/held-<RANK> ($NODE and its pid) and waits there to be stopped.
At the end it writes $OUT/rank-<RANK>.json: acc, resumed_from, the rank the
loaded state belonged to, and the load's source.
"""
import argparse
import hashlib
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

from ft_launcher_client import state  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--hold-at-step", type=int, default=-1)
p.add_argument("--out", required=True)
a = p.parse_args()

rank = int(os.environ.get("RANK", "0"))
rnd = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def blob(rank, step):
    return hashlib.sha256(b"%d/%d" % (rank, step)).digest() * 256  # 8 KiB


info = {}
step, saved = state.load(info=info)
acc, start, owner = 0, 0, None
if saved is not None:
    owner = saved["rank"]
    if saved["step"] != step or saved["blob"] != blob(saved["rank"], step):
        sys.exit("rank %d: the loaded state is inconsistent: %r" % (rank, {k: saved[k] for k in ("rank", "step")}))
    acc, start = saved["acc"], step + 1

for s in range(start, a.steps):
    acc += rank * 1000 + s
    state.save(s, {"rank": rank, "step": s, "acc": acc, "blob": blob(rank, s)})
    if rnd == 0 and s == a.hold_at_step:
        with open(os.path.join(a.out, "held-%d" % rank), "w") as f:
            f.write("%s %d\n" % (os.environ.get("NODE", "?"), os.getpid()))
        while True:
            time.sleep(1)

with open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
    json.dump({"acc": acc, "resumed_from": step if saved is not None else None, "state_rank": owner,
               "source": info.get("source")}, f)
