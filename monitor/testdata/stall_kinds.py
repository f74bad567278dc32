# A rank of a 3-rank gloo job on 127.0.0.1 that heartbeats every step and,
# at step 40, stalls in the way argv[2] names (driven by judge_test.go):
# rank 1 hangs on a lock ("lock") or stalls 3 s without being hung:
# computing ("busy"), waiting on a DataLoader worker ("data") or saving
# ("save"). The others wait for it in the all_reduce. 80 steps, then exit 0.
import os
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from ft_launcher_client import RankMonitorClient

rank = int(os.environ["RANK"])
kind = sys.argv[2]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=rank, world_size=3)
c = RankMonitorClient()
c.init_workload_monitoring()
t = torch.ones(1024)


class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i == 40 and rank == 1 and kind == "data":
            time.sleep(3)  # a slow read of a remote store: idle
        return torch.ones(4)


loader = iter(torch.utils.data.DataLoader(Slow(), batch_size=None, num_workers=1))


def stall():
    if kind == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif kind == "busy":
        end = time.time() + 3
        while time.time() < end:
            pass
    elif kind == "save":
        with tempfile.TemporaryDirectory() as d:
            end = time.time() + 3
            while time.time() < end:
                torch.save(torch.zeros(1 << 20), os.path.join(d, "ckpt.pt"))


for i in range(80):
    next(loader)
    if rank == 1 and i == 40:
        stall()
    dist.all_reduce(t)
    time.sleep(0.02)
    c.send_heartbeat()
c.shutdown_workload_monitoring()
