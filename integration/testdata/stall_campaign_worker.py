#!/usr/bin/python3
"""A torch rank (gloo) whose steps stall in benign ways, for the campaign
of the default clocks (integration/stallcampaign_test.go).

usage: stall_campaign_worker.py SEED [--hangs KINDS]

Round 0: a 30 s first step (busy), then a seeded schedule, the same on
every rank, of benign stalls between ~40 ms steps, each printed to stderr
as "stall KIND RANK SECONDS":
  gc        one rank computes 0.3-1 s (a garbage collection, a slow step)
  save      rank 0 writes a checkpoint for 2, 5, 10 or 30 s, outside any section
  section   the same inside a "checkpointing" section
  eval      every rank computes 20 s (an evaluation)
  data      every 100 steps rank 1's DataLoader worker waits 2 s (a slow
            remote read: idle)
The others wait in the next all_reduce. Every step heartbeats. No timeout is
configured: the launcher's default clocks judge every silence.
Then true hangs (--hangs lock,fifo,stop,collective): in round r <
len(KINDS), rank 1 hangs in way KINDS[r], in round 0 after the schedule,
later after 20 steps; printed as "hang KIND". Round len(KINDS) finishes.
"""
import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ft_launcher_client import RankMonitorClient  # noqa: E402

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
rnd = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def busy(secs):
    end = time.time() + secs
    while time.time() < end:
        pass


def save(secs):
    with tempfile.TemporaryDirectory() as d:
        end = time.time() + secs
        while time.time() < end:
            torch.save(torch.zeros(1 << 18), os.path.join(d, "ckpt.pt"))


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        if rnd == 0 and rank == 1 and i > 0 and i % 100 == 0:
            time.sleep(2)
        return torch.ones(4)


def schedule(seed):
    r = random.Random(seed)
    kinds = ["gc"] * 147 + ["save"] * 10 + ["section"] * 10 + ["eval"] * 2
    r.shuffle(kinds)
    out, step, lengths = {}, 20, [2, 5, 10, 30]
    for n, k in enumerate(kinds):
        step += r.randint(15, 30)
        if k == "gc":
            out[step] = (k, r.randrange(world), round(r.uniform(0.3, 1.0), 2))
        elif k in ("save", "section"):
            out[step] = (k, 0, lengths[n % 4])
        else:
            out[step] = (k, -1, 20)
    return out, step + 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("seed", type=int)
    p.add_argument("--hangs", default="")
    a = p.parse_args()
    dist.init_process_group("gloo")
    c = RankMonitorClient()
    c.init_workload_monitoring()
    t = torch.ones(1024)
    loader = iter(torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=1))
    hangs = [k for k in a.hangs.split(",") if k]
    side = dist.new_group([1, 2 % world]) if world > 2 else None
    if rnd == 0:
        plan, steps = schedule(a.seed)
        busy(30)  # the first step: compilation, warm-up
    else:
        plan, steps = {}, 40
    hang_at = steps - 10 if rnd == 0 else 20
    for i in range(steps):
        next(loader)
        if rnd == 0 and i % 100 == 0 and i > 0 and rank == 0:
            log("stall data 1 2")
        if i in plan:
            kind, who, secs = plan[i]
            if rank == 0:
                log("stall %s %d %s" % (kind, who, secs))
            if kind == "gc" and rank == who:
                busy(secs)
            elif kind == "save" and rank == 0:
                save(secs)
            elif kind == "section" and rank == 0:
                c.start_section("checkpointing")
                save(secs)
                c.end_section("checkpointing")
            elif kind == "eval":
                busy(secs)
        if rnd < len(hangs) and rank == 1 and i == hang_at:
            kind = hangs[rnd]
            log("hang %s" % kind)
            if kind == "lock":
                lock = threading.Lock()
                lock.acquire()
                lock.acquire()
            elif kind == "fifo":
                path = os.path.join(os.environ["OUT"], "fifo-%d" % rnd)
                os.mkfifo(path)
                os.read(os.open(path, os.O_RDWR), 1)
            elif kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif kind == "collective":
                dist.all_reduce(t, group=side)
        dist.all_reduce(t)
        time.sleep(0.03)
        c.send_heartbeat()
    c.shutdown_workload_monitoring()


if __name__ == "__main__":
    main()
