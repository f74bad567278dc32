#!/usr/bin/python3
"""Data-parallel training with in-process restarts and peer heal
(ft_launcher_client.heal, docs/state.md "Peer heal"); integration/peerheal_test.go.

Every rank is a replica: the same seeded model, SGD with momentum, and
gradients averaged by one all_reduce per parameter in a fixed order (no
DDP: its bucket layout may change after the first step, which changes the
order of the additions; docs/state.md). Batches are a pure function of
(rank, step), so any run over the same steps ends with the same weights.
The model and optimizer are built once per process, so a survivor keeps
them across an in-process rejoin; at the start of each round every rank
calls ctx.state.heal with the last step it completed and its live state
(a replacement passes None), and goes on from the next step. The ranks
also save into launcher memory every --save-every steps (the fallback).

--hold-rank R --hold-at-step S: in round 0, rank R, in the middle of step S
(after its backward, before the gradients' all_reduce), writes
$OUT/held (its pid) and waits there to be killed (the test SIGKILLs it);
the other ranks block in that step's all_reduce.

At the end every rank writes $OUT/rank-<RANK>.json: the SHA-256 of its
parameters' bytes, the step it resumed from and what the heal said.
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
p.add_argument("--steps", type=int, default=40)
p.add_argument("--save-every", type=int, default=10)
p.add_argument("--hold-rank", type=int, default=-1)
p.add_argument("--hold-at-step", type=int, default=-1)
p.add_argument("--out", required=True)
a = p.parse_args()

torch.set_num_threads(1)
torch.manual_seed(1234)  # every rank the same: data-parallel replicas
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
done = [None]  # the last step this process completed (survives a rejoin)


def train(ctx):
    rank, world = dist.get_rank(), dist.get_world_size()
    live = None if done[0] is None else {"model": model.state_dict(), "opt": opt.state_dict()}
    info = {}
    step, st = ctx.state.heal(done[0], live, info=info)
    if st is not None and st is not live:
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
    print("[peerheal rank=%d round=%d] heal: %s" % (rank, ctx.round, json.dumps(info, sort_keys=True)), file=sys.stderr, flush=True)
    start = 0 if step is None else step + 1
    for s in range(start, a.steps):
        g = torch.Generator().manual_seed(rank * 100003 + s)
        x = torch.randn(16, 32, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if ctx.round == 0 and (rank, s) == (a.hold_rank, a.hold_at_step):
            with open(os.path.join(a.out, "held.tmp"), "w") as f:
                f.write("%d\n" % os.getpid())
            os.rename(os.path.join(a.out, "held.tmp"), os.path.join(a.out, "held"))
            time.sleep(3600)  # SIGKILLed here by the test
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
            prm.grad.div_(world)
        opt.step()
        done[0] = s  # before ctx.step(), which may raise the restart notice
        ctx.step()
        if (s + 1) % a.save_every == 0:
            ctx.state.save(s, {"model": model.state_dict(), "opt": opt.state_dict()})
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.contiguous().view(-1).numpy().tobytes())
    with open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
        json.dump({"sha256": h.hexdigest(), "resumed_from": step, "heal": info.get("heal"), "source": info.get("source"),
                   "from_rank": info.get("from_rank"), "heal_ms": info.get("seconds", 0) * 1000,
                   "bytes": info.get("bytes")}, f)
    dist.barrier()


ip = InProcess(backend="gloo")
ip.run(train)
ip.close()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skip torch 1.13's gloo teardown (docs/inprocess.md)
