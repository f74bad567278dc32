#!/usr/bin/python3
"""Small deterministic DDP training (gloo, CPU) used by the integration tests.

On a GPU (--device cuda) the same training runs on CUDA tensors, with gloo
or, one rank per GPU, --backend nccl; bench/prewarm.py uses it to measure
restarts on a GPU (docs/benchmarks.md).

The run must end with bit-identical weights whether it runs uninterrupted or
crashes and resumes from a checkpoint. To make that true:

* every batch is a pure function of (seed, step, rank), generated on the fly
  by a private torch.Generator, so resuming at step k replays exactly the
  batches k, k+1, ... of an uninterrupted run;
* the model uses dropout driven by the global torch RNG; the RNG state of every
  rank is gathered into the checkpoint and restored on resume, so the dropout
  masks after a resume are the ones the uninterrupted run drew;
* the checkpoint holds model, optimizer (Adam moments), step and RNG states and
  is written atomically by rank 0 (temp file in the same dir, fsync, rename,
  fsync of the directory), so a crash never leaves a half-written checkpoint.

Fault injection (each fires once, only in restart cycle 0 and only if its
marker file is absent from --ckpt-dir):
  --crash-at-step S --crash-rank R   rank R calls os._exit(1) before step S
  --hang-at-step S --hang-rank R     rank R sleeps forever inside the monitored
                                     "step" section before step S
  --fault-gate PATH                  every rank waits before the fault's step,
                                     heartbeating, until PATH exists (a test
                                     opens it once the launcher is ready for it)

When FT_RANK_MONITOR_IPC_SOCKET is set and the ft-launcher Python client is
importable, every step sends a heartbeat and is wrapped in a "step" section.

At the end rank 0 writes --out: JSON with the SHA-256 of the concatenated
float32 bytes of all parameters (state_dict order) so a test can compare runs
without torch, and touches $FAULT_TOL_FINISHED_FLAG_FILE when set.

Run with torchrun or ft-launcher, e.g.
  ft-launcher --nproc-per-node 2 --max-restarts 1 ddp_train.py \
      --ckpt-dir /tmp/ck --out /tmp/w.json --crash-at-step 25 --crash-rank 1
"""
import argparse
import glob
import hashlib
import json
import os
import re
import sys
import time

# Keep the per-process thread count at 1 before torch sizes its pools.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# cuBLAS is deterministic only with a fixed workspace (--device cuda).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "client", "python")))

CKPT_RE = re.compile(r"^ckpt_(\d{8})\.pt$")
IN_DIM, HIDDEN, OUT_DIM = 16, 32, 4


def log(msg):
    print(f"[ddp_train rank={os.environ.get('RANK', '?')} "
          f"cycle={os.environ.get('TORCHELASTIC_RESTART_COUNT', '?')}] {msg}",
          file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint every K steps (0: never)")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--out", required=True, help="final weights summary (JSON), written by rank 0")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (slow runs down)")
    p.add_argument("--crash-at-step", type=int, default=-1)
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--hang-at-step", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=0)
    p.add_argument("--fault-gate", default="", help="wait before an injected fault's step until this file exists")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: GPU LOCAL_RANK modulo the GPUs visible (ranks may share one)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="process group backend (nccl: --device cuda, one rank per GPU)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="width of the hidden layers")
    return p.parse_args(argv)


class MLP(nn.Module):
    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(IN_DIM, hidden), nn.Tanh(), nn.Dropout(p=0.1),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, OUT_DIM),
        )

    def forward(self, x):
        return self.net(x)


# A fixed "teacher" that defines the regression target; built from the seed only.
def teacher_weights(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(IN_DIM, OUT_DIM, generator=g), torch.randn(OUT_DIM, generator=g)


def batch_for(seed, step, rank, batch_size, teacher):
    """The batch of (step, rank): independent of any earlier step, so resumable."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank + 1)
    x = torch.randn(batch_size, IN_DIM, generator=g)
    w, b = teacher
    y = torch.sin(x @ w + b) + 0.05 * torch.randn(batch_size, OUT_DIM, generator=g)
    return x, y


class Monitor:
    """Optional heartbeats/sections through the ft-launcher rank monitor client."""

    def __init__(self):
        self.client = None
        if not os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
            return
        try:
            from ft_launcher_client import RankMonitorClient
        except ImportError as e:
            log(f"rank monitor client not importable, running unmonitored: {e}")
            return
        try:
            c = RankMonitorClient()
            c.init_workload_monitoring()
            self.client = c
        except Exception as e:  # an unmonitored run is better than no run
            log(f"rank monitor init failed, running unmonitored: {e!r}")

    def _call(self, name, *args):
        if self.client is not None:
            getattr(self.client, name)(*args)

    def heartbeat(self):
        self._call("send_heartbeat")

    def start(self, section):
        self._call("start_section", section)

    def end(self, section):
        self._call("end_section", section)

    def shutdown(self):
        if self.client is not None:
            try:
                self.client.shutdown_workload_monitoring()
            except Exception as e:
                log(f"rank monitor shutdown: {e!r}")


def ordered_allreduce_hook(process_group, bucket):
    """Average a gradient bucket summing ranks in the fixed order 0..W-1.

    A ring allreduce sums each element in an order that depends on where the
    element sits in the bucket, and DDP lays out its buckets differently in the
    first iteration after construction than after it rebuilds them. With more
    than two ranks float addition order matters, so a run resumed at step k
    would drift from the uninterrupted one in the last bits. Gathering every
    rank's bucket and summing in rank order makes the result independent of
    bucket layout. Cheap at this model size.
    """
    buf = bucket.buffer()
    world = dist.get_world_size(process_group)
    parts = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(parts, buf, group=process_group)
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    total /= world
    fut = torch.futures.Future()
    fut.set_result(total)
    return fut


def setup_device(args):
    """The rank's device: the CPU, or its GPU with the CUDA context created
    here, before the process group (NCCL needs the device set first)."""
    if args.device == "cpu":
        if args.backend == "nccl":
            raise SystemExit("--backend nccl needs --device cuda")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible to this rank")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize(dev)  # the context exists now (bench/workers/ddp_probe.py stamps here)
    return dev


def init_process_group(args, dev):
    kw = {}
    if args.backend == "nccl":
        kw["device_id"] = dev  # torch >= 2.3: the NCCL communicator is built here, not at the first collective
    t0 = time.monotonic()
    dist.init_process_group(backend=args.backend, **kw)
    log(f"init_process_group took {time.monotonic() - t0:.3f}s")


def rng_state(dev):
    """This rank's RNG state for the checkpoint: the CPU generator's, and on
    a GPU the CUDA generator's too (dropout draws from it there)."""
    if dev.type == "cpu":
        return torch.get_rng_state()
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(dev)}


def set_rng_state(state, dev):
    if isinstance(state, dict):
        torch.set_rng_state(state["cpu"])
        if dev.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], dev)
    else:
        torch.set_rng_state(state)


def wrap_ddp(model, dev):
    return DDP(model) if dev.type == "cpu" else DDP(model, device_ids=[dev.index])


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, write_fn, binary=True):
    """Write via a temp file in the same dir, fsync, rename, fsync the dir."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".tmp.{os.path.basename(path)}.{os.getpid()}")
    try:
        with open(tmp, "wb" if binary else "w") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_dir(d)


def latest_checkpoint(ckpt_dir):
    best = None
    for name in os.listdir(ckpt_dir):
        m = CKPT_RE.match(name)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), os.path.join(ckpt_dir, name))
    return best


def save_checkpoint(ckpt_dir, step, model, opt, rng_states, keep=2):
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": rng_states,  # one torch RNG state per rank, index = rank
        "world_size": len(rng_states),
    }
    path = os.path.join(ckpt_dir, f"ckpt_{step:08d}.pt")
    atomic_write(path, lambda f: torch.save(state, f))
    # Drop old checkpoints only after the new one is durable.
    old = sorted(p for p in glob.glob(os.path.join(ckpt_dir, "ckpt_*.pt"))
                 if CKPT_RE.match(os.path.basename(p)))
    for p in old[:-keep]:
        os.unlink(p)


def marker(ckpt_dir, kind, step, rank):
    return os.path.join(ckpt_dir, f"_injected_{kind}_step{step}_rank{rank}")


def should_inject(ckpt_dir, kind, step, rank):
    """Fire once: only in cycle 0 and only if no marker says it already fired."""
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0")
    return cycle == 0 and not os.path.exists(marker(ckpt_dir, kind, step, rank))


def touch_marker(ckpt_dir, kind, step, rank):
    with open(marker(ckpt_dir, kind, step, rank), "w") as f:
        f.write(f"{os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(ckpt_dir)


def params_summary(model, args, final_loss, resumed_from):
    blob = b"".join(
        t.detach().to(torch.float32).cpu().contiguous().numpy().tobytes()
        for _, t in model.state_dict().items()
    )
    flat = torch.cat([t.detach().to(torch.float32).cpu().reshape(-1) for t in model.state_dict().values()])
    return {
        "sha256": hashlib.sha256(blob).hexdigest(),
        "num_params": int(flat.numel()),
        # repr of a float32 widened to float64 is exact, so these compare bitwise.
        "first_values": [float(v) for v in flat[:8].tolist()],
        "steps": args.steps,
        "final_loss": final_loss,
        "resumed_from_step": resumed_from,
        "world_size": dist.get_world_size(),
        "torch_version": torch.__version__,
        # Which store the launcher gave the ranks (ft-launcher --agent-store).
        "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
    }


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    dev = setup_device(args)
    init_process_group(args, dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.ckpt_dir, exist_ok=True)
    mon = Monitor()
    mon.start("setup")

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = MLP(args.hidden).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-4)
    torch.manual_seed(args.seed + 7919 * (rank + 1))  # per-rank dropout stream

    # Rank 0 picks the checkpoint and tells everyone, so all ranks agree.
    pick = [None]
    if rank == 0:
        found = latest_checkpoint(args.ckpt_dir)
        pick[0] = found[1] if found else None
    dist.broadcast_object_list(pick, src=0)
    start_step = 0
    if pick[0] is not None:
        state = torch.load(pick[0], map_location="cpu")  # RNG states must stay on the CPU
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if state["world_size"] != world:
            raise SystemExit(f"checkpoint {pick[0]} is for world size {state['world_size']}, not {world}")
        set_rng_state(state["rng"][rank], dev)
        start_step = state["step"]
        log(f"resumed from {pick[0]} at step {start_step}")

    ddp = wrap_ddp(model, dev)
    ddp.register_comm_hook(None, ordered_allreduce_hook)
    loss_fn = nn.MSELoss()
    teacher = teacher_weights(args.seed)
    mon.end("setup")

    loss_val = None
    for step in range(start_step, args.steps):
        if args.fault_gate and any(
                step == at and should_inject(args.ckpt_dir, kind, at, r)
                for kind, at, r in (("crash", args.crash_at_step, args.crash_rank),
                                    ("hang", args.hang_at_step, args.hang_rank))):
            while not os.path.exists(args.fault_gate):
                mon.heartbeat()
                time.sleep(0.2)
        if (step, rank) == (args.crash_at_step, args.crash_rank) and \
                should_inject(args.ckpt_dir, "crash", step, rank):
            touch_marker(args.ckpt_dir, "crash", step, rank)
            log(f"injected crash at step {step}")
            os._exit(1)

        mon.heartbeat()
        mon.start("step")
        if (step, rank) == (args.hang_at_step, args.hang_rank) and \
                should_inject(args.ckpt_dir, "hang", step, rank):
            touch_marker(args.ckpt_dir, "hang", step, rank)
            log(f"injected hang at step {step}")
            while True:
                time.sleep(3600)

        x, y = batch_for(args.seed, step, rank, args.batch_size, teacher)
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        loss_val = float(loss.detach())
        mon.end("step")
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)

        done = step + 1
        if args.ckpt_every > 0 and done % args.ckpt_every == 0 and done < args.steps:
            mon.start("checkpointing")
            rng = [None] * world
            dist.all_gather_object(rng, rng_state(dev))
            if rank == 0:
                save_checkpoint(args.ckpt_dir, done, model, opt, rng)
            dist.barrier()  # nobody runs ahead of a checkpoint that is not durable yet
            mon.end("checkpointing")

    if rank == 0:
        summary = params_summary(model, args, loss_val, start_step)
        atomic_write(args.out, lambda f: json.dump(summary, f, indent=1, sort_keys=True), binary=False)
        log(f"done: sha256={summary['sha256']} loss={loss_val}")
        flag = os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE")
        if flag:
            with open(flag, "a"):
                pass
    dist.barrier()
    mon.shutdown()
    exit_skipping_teardown(0)


def exit_skipping_teardown(code):
    """End the process now, without running torch's destructors.

    torch 1.13's DDP can deadlock in them: the Reducer drops the last
    reference to the gloo process group while holding the GIL and joins the
    group's worker threads, while a worker that is still releasing the last
    collective's tensors waits for the GIL. The rank then never exits; this
    project's CI saw it (gdb: the main thread in std::thread::join under
    ProcessGroupGloo::~ProcessGroupGloo under Reducer::~Reducer, a worker in
    PyEval_AcquireThread under TensorImpl::~TensorImpl). Everything this
    script writes is durable by now (atomic_write fsyncs), so nothing is lost.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
