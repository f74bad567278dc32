#!/usr/bin/python3
"""Makes report/testdata/inprocess_state.jsonl (report tests): a small
training under ft-launcher --restart-mode in-process --state-dir, with
"step" sections, launcher-held saves counted as checkpoints (ctx.state with
the rank's monitor) and a crash of rank 1 at step 13 in round
0 and of rank 0 at step 24 in round 1. With --no-step-sections it sends
heartbeats only (ctx.step()), no "step" sections, and makes
report/testdata/inprocess_nosteps.jsonl. Reproduce with:

    ft-launcher --standalone --nproc-per-node 2 --max-restarts 3 \
        --restart-mode in-process --state-dir DIR/state --state-persist-every 2 \
        --event-log DIR/events.jsonl report/testdata/inprocess_state_train.py
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ft_launcher_client.inprocess import InProcess  # noqa: E402

STEPS, EVERY, CRASH1, CRASH2 = 30, 5, 13, 24


def train(ctx):
    rank = dist.get_rank()
    torch.manual_seed(0)
    w = torch.zeros(64)
    info = {}
    step, saved = ctx.state.load(info=info)
    start = 0
    if saved is not None:
        w.copy_(saved["w"])
        start = step + 1
    mon = ctx.monitor
    sections = "--no-step-sections" not in sys.argv
    for s in range(start, STEPS):
        if ctx.round == 0 and rank == 1 and s == CRASH1:
            os._exit(1)
        if ctx.round == 1 and rank == 0 and s == CRASH2:
            os._exit(1)
        if sections:
            mon.start_section("step")
        g = torch.full((64,), float(s))
        dist.all_reduce(g)
        w -= 0.01 * g
        time.sleep(0.1)
        if sections:
            mon.end_section("step")
        ctx.step()
        if (s + 1) % EVERY == 0:
            ctx.state.save(s, {"w": w})
    dist.barrier()


def main():
    ip = InProcess(backend="gloo")
    ip.run(train)
    ip.close()
    os._exit(0)


if __name__ == "__main__":
    main()
