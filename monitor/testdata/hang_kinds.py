# A rank of a 3-rank gloo job on 127.0.0.1 that heartbeats every step and,
# at step 20, hangs in the way argv[2] names (driven by judge_test.go).
# Rank 1 is the one that hangs; the others wait for it in the all_reduce.
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from ft_launcher_client import RankMonitorClient

rank = int(os.environ["RANK"])
kind = sys.argv[2]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=rank, world_size=3)
side = dist.new_group([1, 2])  # every rank makes it; rank 2 never uses it
c = RankMonitorClient()
c.init_workload_monitoring()
t = torch.ones(1024)
lock = threading.Lock()


def hang():
    if kind == "lock":
        lock.acquire()
        lock.acquire()  # HANG:lock
    elif kind == "fifo":
        fd = os.open(sys.argv[3], os.O_RDWR)
        os.read(fd, 1)  # HANG:fifo
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "collective":
        dist.all_reduce(t, group=side)  # HANG:collective


def step(i):
    if rank == 1 and i == 20:
        hang()
    dist.all_reduce(t)  # WAIT
    time.sleep(0.02)


for i in range(100000):
    step(i)
    c.send_heartbeat()
