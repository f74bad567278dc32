#!/usr/bin/python3
"""Data-parallel training that runs until told to stop, for the straggler
tests (integration/straggler_test.go; docs/stragglers.md).

Like peerheal_train.py: replicas of one seeded model, gradients averaged
by one all_reduce per parameter in a fixed order, batches a pure function
of (rank, step), in-process restarts with ctx.state.heal, a save into
launcher memory every --save-every steps. Each step also does --work
matmuls that touch no weight (CPU work a throttled node takes longer to
do). Every rank appends "<step> <unix time> <round>" to $OUT/steps-<RANK>
and writes its pid to $OUT/pid-<RANK> at each start.

Without --steps the ranks run until $OUT/finish exists: rank 0 reads it
and the stop travels in the step's last all_reduce, so every rank stops
after the same step, which goes to $OUT/last-step. With --steps N they run
N steps (the uninterrupted reference of the same steps). At the end every
rank writes $OUT/rank-<RANK>.json with the SHA-256 of its parameters.
"""
import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

from ft_launcher_client.inprocess import InProcess  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0)
p.add_argument("--save-every", type=int, default=20)
p.add_argument("--work", type=int, default=40)
p.add_argument("--out", required=True)
a = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(1234)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
done = [None]
work = torch.randn(128, 128, generator=torch.Generator().manual_seed(7))


def train(ctx):
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(a.out, "pid-%d" % rank), "w") as f:
        f.write("%d\n" % os.getpid())
    live = None if done[0] is None else {"model": model.state_dict(), "opt": opt.state_dict()}
    step, st = ctx.state.heal(done[0], live)
    if st is not None and st is not live:
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
    log = open(os.path.join(a.out, "steps-%d" % rank), "a", buffering=1)
    s = 0 if step is None else step + 1
    while True:
        if a.steps and s >= a.steps:
            break
        w = work
        for _ in range(a.work):
            w = torch.tanh(w @ w * 0.01)
        g = torch.Generator().manual_seed(rank * 100003 + s)
        x = torch.randn(16, 32, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
            prm.grad.div_(world)
        stop = torch.zeros(1)
        if not a.steps and rank == 0 and os.path.exists(os.path.join(a.out, "finish")):
            stop[0] = 1
        dist.all_reduce(stop)
        opt.step()
        done[0] = s
        log.write("%d %.6f %d\n" % (s, time.time(), ctx.round))
        ctx.step()
        if (s + 1) % a.save_every == 0:
            ctx.state.save(s, {"model": model.state_dict(), "opt": opt.state_dict()})
        if stop[0] > 0:
            if rank == 0:
                with open(os.path.join(a.out, "last-step"), "w") as f:
                    f.write("%d\n" % s)
            break
        s += 1
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.contiguous().view(-1).numpy().tobytes())
    with open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
        json.dump({"sha256": h.hexdigest(), "last_step": done[0]}, f)
    dist.barrier()


ip = InProcess(backend="gloo")
ip.run(train)
ip.close()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip torch 1.13's gloo teardown (docs/inprocess.md)
