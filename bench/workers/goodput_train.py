#!/usr/bin/python3
"""The training script of bench/goodput.py: a small DDP (gloo, CPU) job that
trains until it is stopped, run unchanged under ft-launcher, torchrun and
nvrx's ft_launcher. GOODPUT_LAUNCHER (ft, torchrun, nvrx) says which, because
ft-launcher and nvrx name their monitor socket alike.

What it does under each, each launcher's best path:
- ft: ft_launcher_client.inprocess (in-process restarts), a heartbeat and a
  `step` section per step, and ctx.state.save after every step (a memory
  copy into the launcher's segment; counted as a checkpoint by the report).
  A rank restores the newest of its launcher-held state and the file
  checkpoint.
- nvrx: nvrx's RankMonitorClient, a heartbeat per step (its hang detection).
- torchrun: nothing extra (torchrun has no hang detection: a hung peer is
  found by the process group's timeout).
All three: rank 0 writes a file checkpoint (torch.save, fsync, rename) when
the newest one is GOODPUT_CKPT_EVERY seconds old (300 = every 5 minutes of
the job's wall clock; the newest file's mtime is the clock, so a restart does
not reset it), and every rank restores from it when it has nothing newer.

Since the ranks may restore different steps (a rank killed between its
optimizer step and its save), they agree on the newest one and its holder
broadcasts it (the replicas of data parallelism are identical).

Each rank appends to GOODPUT_DIR/steps-rank<R>.log: "B pid round start t"
when its training loop begins, "S step t" after each step (t: time.time()).
bench/goodput.py computes the productive time from rank 0's log. Each rank
also writes GOODPUT_DIR/pids/rank-<R> (its pid) so faults find it.
"""
import datetime
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

MODE = os.environ.get("GOODPUT_LAUNCHER", "torchrun")
DIR = os.environ["GOODPUT_DIR"]
CKPT_DIR = os.path.join(DIR, "ckpt")
CKPT_EVERY = float(os.environ.get("GOODPUT_CKPT_EVERY", "300"))
T0 = float(os.environ.get("GOODPUT_T0", time.time()))
PG_TIMEOUT = float(os.environ.get("GOODPUT_PG_TIMEOUT", "15"))
IN, HID, OUT, BATCH, SEED = 256, 256, 16, 64, 1234


def model_and_opt():
    torch.manual_seed(SEED)
    m = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU(), nn.Linear(HID, OUT))
    return m, torch.optim.Adam(m.parameters(), lr=1e-3)


def batch(step, rank):
    g = torch.Generator().manual_seed(SEED * 1_000_003 + step * 1009 + rank + 1)
    x = torch.randn(BATCH, IN, generator=g)
    return x, x[:, :OUT].sin()


def atomic_write_text(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def latest_file():
    """(next step, path) of the newest file checkpoint, or (0, None)."""
    best = (0, None)
    for n in os.listdir(CKPT_DIR):
        if n.startswith("ckpt-") and n.endswith(".pt"):
            s = int(n[5:-3])
            if s > best[0]:
                best = (s, os.path.join(CKPT_DIR, n))
    return best


def save_file(nxt, model, opt):
    path = os.path.join(CKPT_DIR, f"ckpt-{nxt:09d}.pt")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    old = sorted(n for n in os.listdir(CKPT_DIR) if n.startswith("ckpt-") and n.endswith(".pt"))[:-2]
    for n in old:  # keep the newest two
        os.unlink(os.path.join(CKPT_DIR, n))


def restore(ctx, model, opt):
    """The next step to run, with model and opt restored to the newest state
    any rank holds (launcher memory or the file)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, state = latest_file()
    src = "file" if state else "none"
    if ctx is not None:
        step, mem = ctx.state.load()
        if mem is not None and step + 1 > nxt:
            nxt, state, src = step + 1, mem, "memory"
    have = [None] * world
    dist.all_gather_object(have, nxt)
    best = max(have)
    if best == 0:
        return 0, "none"
    holder = have.index(best)
    if all(h == best for h in have):
        if src == "file":
            state = torch.load(state, map_location="cpu")
    else:
        box = [None]
        if rank == holder:
            box[0] = torch.load(state, map_location="cpu") if src == "file" else state
        dist.broadcast_object_list(box, src=holder)
        state, src = box[0], f"{src} of rank {holder}" if rank == holder else f"rank {holder}"
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return best, src


def train(ctx, nvrx=None):
    rank = dist.get_rank()
    rnd = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0")
    if ctx is not None:
        rnd = ctx.round
    atomic_write_text(os.path.join(DIR, "pids", f"rank-{rank}"), f"{os.getpid()}\n")
    model, opt = model_and_opt()
    start, src = restore(ctx, model, opt)
    ddp = DDP(model)
    loss_fn = nn.MSELoss()
    last_ckpt = max(T0, os.path.getmtime(latest_file()[1]) if latest_file()[1] else T0)
    log = open(os.path.join(DIR, f"steps-rank{rank}.log"), "a", buffering=1)
    log.write(f"B {os.getpid()} {rnd} {start} {time.time():.3f} {src}\n")
    step = start
    while True:
        if ctx is not None:
            ctx.monitor.start_section("step", iteration=step)
        x, y = batch(step, rank)
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        opt.step()
        if ctx is not None:
            ctx.monitor.end_section("step")
            ctx.state.save(step, {"model": model.state_dict(), "opt": opt.state_dict()})
        log.write(f"S {step} {time.time():.3f}\n")
        if rank == 0 and time.time() - last_ckpt >= CKPT_EVERY:
            save_file(step + 1, model, opt)
            last_ckpt = time.time()
            log.write(f"C {step + 1} {last_ckpt:.3f}\n")
        step += 1
        if ctx is not None:
            ctx.step()
        elif nvrx is not None:
            nvrx.send_heartbeat()


def main():
    torch.set_num_threads(1)
    os.makedirs(CKPT_DIR, exist_ok=True)
    os.makedirs(os.path.join(DIR, "pids"), exist_ok=True)
    timeout = datetime.timedelta(seconds=PG_TIMEOUT)
    if MODE == "ft":
        from ft_launcher_client.inprocess import InProcess

        InProcess(backend="gloo", timeout=PG_TIMEOUT).run(train)
        return
    dist.init_process_group("gloo", timeout=timeout)
    nvrx = None
    if MODE == "nvrx":
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        nvrx = RankMonitorClient()
        nvrx.init_workload_monitoring()
    train(None, nvrx)


if __name__ == "__main__":
    main()
