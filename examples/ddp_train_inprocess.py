#!/usr/bin/python3
"""ddp_train.py's training with in-process restarts (ft_launcher_client.inprocess).

Run under ``ft-launcher --restart-mode in-process``: when a rank fails, the
surviving ranks stay in their processes, rebuild the process group for the
next round and restore from the last checkpoint (or, with
``--restore memory``, from an in-memory copy taken when the checkpoint was
written), and the final weights are bit-identical to an uninterrupted
``ddp_train.py`` run with the same checkpoint schedule. Same model, batches,
checkpoints and --out summary as ddp_train.py (imported from it).

Fault injection on top of ddp_train.py's (--crash-at-step/--crash-rank,
--hang-at-step/--hang-rank, both only in round 0; a hang here stops the
rank's heartbeats, 3 steps before it, so a heartbeat timeout finds it):
  --stuck-rank R        in round 0, rank R ignores the restart notice: when its
                        collective fails it sleeps instead of rejoining
  --crash-again-rank R  rank R crashes again at the start of round 1, before
                        its first step (a failure during the in-process restart)
  --stopped-rank R      in round 0, at --crash-at-step, rank R stops itself with
                        SIGSTOP before the step (a frozen process), and the
                        crashing rank crashes only once R is stopped
  --hang-quiet-steps N  the hanging rank stops its heartbeats N steps before
                        it hangs (default 3, so the heartbeat timeout picks
                        it); 0: it hangs as in most jobs, its peers waiting in
                        the collective fall silent with it
"""
import os
import signal
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "client", "python")))

import ddp_train as base  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from ft_launcher_client.inprocess import InProcess  # noqa: E402


def parse_args(argv):
    extra = []
    rest = []
    it = iter(argv)
    for a in it:
        if a in ("--stuck-rank", "--stopped-rank", "--crash-again-rank", "--restore", "--hang-quiet-steps"):
            extra += [a, next(it)]
        else:
            rest.append(a)
    args = base.parse_args(rest)
    args.stuck_rank, args.crash_again_rank, args.restore, args.hang_quiet_steps = -1, -1, "checkpoint", 3
    args.stopped_rank = -1
    for k, v in zip(extra[::2], extra[1::2]):
        if k == "--restore":
            if v not in ("checkpoint", "memory"):
                raise SystemExit("--restore must be checkpoint or memory, not %r" % v)
            args.restore = v
        else:
            setattr(args, k[2:].replace("-", "_"), int(v))
    return args


def wait_stopped(pidfile, bound=120.0):
    """Wait until the process named in pidfile is stopped (state T)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            with open(pidfile) as f:
                pid = int(f.read())
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    raise SystemExit("the rank to stop did not stop within %.0f s" % bound)


def cycle():
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0")


def once(ckpt_dir, kind, rank):
    """True the first time only (a marker file in ckpt_dir)."""
    m = base.marker(ckpt_dir, kind, 0, rank)
    if os.path.exists(m):
        return False
    base.touch_marker(ckpt_dir, kind, 0, rank)
    return True


def restore_state(args, rank, ctx):
    """(step, state, where): the memory copy with --restore memory when this
    rank has one for the step rank 0 restores, else the checkpoint file."""
    mem_step, mem = ctx.snapshot.load() if args.restore == "memory" else (None, None)
    pick = [None]
    if rank == 0:
        if mem is not None:
            pick[0] = mem_step
        else:
            found = base.latest_checkpoint(args.ckpt_dir)
            pick[0] = found[0] if found else None
    dist.broadcast_object_list(pick, src=0)  # every rank restores the same step
    if pick[0] is None:
        return 0, None, None
    if mem is not None and mem_step == pick[0]:
        return pick[0], mem, "memory"
    # No memory copy here (the replacement rank): the file holds the same state.
    path = os.path.join(args.ckpt_dir, f"ckpt_{pick[0]:08d}.pt")
    return pick[0], torch.load(path, map_location="cpu"), path


def build(args, rank, ctx, dev):
    """Model, optimizer and start step, exactly as a fresh ddp_train.py rank
    builds them: seeded init, then the restored state."""
    torch.manual_seed(args.seed)
    model = base.MLP(args.hidden).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-4)
    torch.manual_seed(args.seed + 7919 * (rank + 1))
    start, state, where = restore_state(args, rank, ctx)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        base.set_rng_state(state["rng"][rank], dev)
        base.log(f"restored from {where} at step {start} (in-process restarts so far: {ctx.attempt})")
    return model, opt, start


def train(ctx, args, dev):
    rank, world = dist.get_rank(), dist.get_world_size()
    # Once per round and process: which process holds which rank (the
    # integration tests check that survivors keep theirs).
    base.log(f"train: pid={os.getpid()} rank={rank} world={world}")
    if (rank, cycle()) == (args.crash_again_rank, 1) and once(args.ckpt_dir, "crash_again", rank):
        base.log("injected crash at the start of round 1")
        os._exit(1)
    model, opt, start = build(args, rank, ctx, dev)
    ddp = base.wrap_ddp(model, dev)
    ddp.register_comm_hook(None, base.ordered_allreduce_hook)
    loss_fn = nn.MSELoss()
    teacher = base.teacher_weights(args.seed)
    loss_val = None
    for step in range(start, args.steps):
        if args.fault_gate and cycle() == 0 and any(
                step == at and base.should_inject(args.ckpt_dir, kind, at, r)
                for kind, at, r in (("crash", args.crash_at_step, args.crash_rank),
                                    ("hang", args.hang_at_step, args.hang_rank))):
            while not os.path.exists(args.fault_gate):  # see ddp_train.py's --fault-gate
                ctx.monitor.send_heartbeat()
                time.sleep(0.2)
        if (step, rank) == (args.crash_at_step, args.stopped_rank) and cycle() == 0 and \
                base.should_inject(args.ckpt_dir, "stop", step, rank):
            base.touch_marker(args.ckpt_dir, "stop", step, rank)
            base.log(f"injected stop (SIGSTOP) at step {step}")
            with open(os.path.join(args.ckpt_dir, "stopped.pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(args.ckpt_dir, "stopped.pid.tmp"), os.path.join(args.ckpt_dir, "stopped.pid"))
            os.kill(os.getpid(), signal.SIGSTOP)
        if (step, rank) == (args.crash_at_step, args.crash_rank) and \
                base.should_inject(args.ckpt_dir, "crash", step, rank):
            if args.stopped_rank >= 0 and cycle() == 0:
                wait_stopped(os.path.join(args.ckpt_dir, "stopped.pid"))
            base.touch_marker(args.ckpt_dir, "crash", step, rank)
            base.log(f"injected crash at step {step}")
            os._exit(1)
        if (step, rank) == (args.hang_at_step, args.hang_rank) and \
                base.should_inject(args.ckpt_dir, "hang", step, rank):
            base.touch_marker(args.ckpt_dir, "hang", step, rank)
            base.log(f"injected hang at step {step} (no more heartbeats)")
            while True:
                time.sleep(3600)
        x, y = base.batch_for(args.seed, step, rank, args.batch_size, teacher)
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        try:
            loss = loss_fn(ddp(x), y)
            loss.backward()
        except RuntimeError:
            if rank == args.stuck_rank and cycle() == 0:
                base.log("ignoring the restart notice (injected)")
                while True:
                    time.sleep(3600)
            raise
        opt.step()
        loss_val = float(loss.detach())
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
        if rank == args.hang_rank and cycle() == 0 and args.hang_at_step - args.hang_quiet_steps <= step < args.hang_at_step:
            # The rank about to hang stops its heartbeats early, so the
            # heartbeat timeout picks it, not a peer waiting for it.
            ctx.check()
        else:
            ctx.step()
        done = step + 1
        if args.ckpt_every > 0 and done % args.ckpt_every == 0 and done < args.steps:
            rng = [None] * world
            dist.all_gather_object(rng, base.rng_state(dev))
            if rank == 0:
                base.save_checkpoint(args.ckpt_dir, done, model, opt, rng)
            if args.restore == "memory":
                ctx.snapshot.save(done, model=model.state_dict(), optimizer=opt.state_dict(), rng=rng)
            dist.barrier()
    if rank == 0:
        summary = base.params_summary(model, args, loss_val, start)
        summary["inprocess_restarts"] = ctx.attempt
        base.atomic_write(args.out, lambda f: base.json.dump(summary, f, indent=1, sort_keys=True), binary=False)
        base.log(f"done: sha256={summary['sha256']} loss={loss_val}")
        flag = os.environ.get("FAULT_TOL_FINISHED_FLAG_FILE")
        if flag:
            with open(flag, "a"):
                pass
    dist.barrier()
    return ddp  # main keeps it: its destructor may deadlock (base.exit_skipping_teardown)


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    dev = base.setup_device(args)  # once per process: a survivor keeps its CUDA context
    ip = InProcess(backend=args.backend)
    ddp = ip.run(train, args, dev)  # noqa: F841  kept alive: its destructor may deadlock (base.exit_skipping_teardown)
    ip.close()
    base.exit_skipping_teardown(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
