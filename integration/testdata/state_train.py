#!/usr/bin/python3
"""Deterministic training that keeps its state in ft-launcher's memory
(ft_launcher_client.state, docs/state.md); integration/state_test.go.

Each rank trains its own small model (SGD with momentum) on batches that are
a pure function of (rank, step), saving the whole state after every step.
At start it loads the newest save (launcher memory, else the state
directory) and goes on from the next step, so the final weights equal an
uninterrupted run's whatever step it crashed at. --crash-at-step S
--crash-rank R: rank R exits 1 right after its save of step S, in round 0,
once the other ranks have saved step S+5 and wait there until the launcher
stops them (so every rank resumes from memory, deterministically).

--hold-at-step H: in round 0 every rank, right after its save of step H,
writes $OUT/held-<RANK> (its $NODE and pid) and waits there to be stopped
(a node loss test kills one node meanwhile; state_test.go).

At the end every rank writes $OUT/rank-<RANK>.json: the SHA-256 of its
parameters' bytes, where it resumed from, and the load's source.
"""
import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

from ft_launcher_client import RankMonitorClient, state  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--crash-at-step", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--hold-at-step", type=int, default=-1)
p.add_argument("--step-sleep", type=float, default=0)
p.add_argument("--out", required=True)
a = p.parse_args()

rank = int(os.environ.get("RANK", "0"))
rnd = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
torch.manual_seed(1234 + rank)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

mon = RankMonitorClient()
mon.init_workload_monitoring()

info = {}
# Restored straight into the model's and optimizer's tensors (docs/state.md,
# "Restoring into existing tensors"): no load_state_dict calls.
step, saved = state.load(info=info, into={"model": model, "opt": opt})
start = 0
if saved is not None:
    start = step + 1

for s in range(start, a.steps):
    g = torch.Generator().manual_seed(rank * 100003 + s)
    x = torch.randn(16, 32, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    mon.send_heartbeat()
    if a.step_sleep:
        time.sleep(a.step_sleep)
    state.save(s, {"model": model.state_dict(), "opt": opt.state_dict()}, monitor=mon)
    if rnd == 0 and s == a.crash_at_step and rank == a.crash_rank:
        # Crash once every other rank has saved step S+5 and waits there.
        others = [r for r in range(int(os.environ.get("WORLD_SIZE", "1"))) if r != rank]
        while not all(os.path.exists(os.path.join(a.out, "reached-%d" % r)) for r in others):
            time.sleep(0.01)
        os._exit(1)
    if rnd == 0 and s == a.hold_at_step:
        with open(os.path.join(a.out, "held-%d.tmp" % rank), "w") as f:
            f.write("%s %d\n" % (os.environ.get("NODE", ""), os.getpid()))
        os.rename(os.path.join(a.out, "held-%d.tmp" % rank), os.path.join(a.out, "held-%d" % rank))
        time.sleep(3600)  # stopped here by the restart
    if rnd == 0 and s == a.crash_at_step + 5 and a.crash_rank >= 0 and rank != a.crash_rank:
        open(os.path.join(a.out, "reached-%d" % rank), "w").close()
        time.sleep(3600)  # stopped here by the restart

h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.contiguous().view(-1).numpy().tobytes())
with open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
    json.dump({"sha256": h.hexdigest(), "resumed_from": step, "source": info.get("source"),
               "load_ms": info.get("seconds", 0) * 1000}, f)
mon.shutdown_workload_monitoring()
