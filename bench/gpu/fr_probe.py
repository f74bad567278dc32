#!/usr/bin/env python3
"""One NCCL rank that hangs after some all_reduces, for ft-launcher's NCCL
flight recorder capture on a GPU (bench/gpu/checks.sh, "flight recorder").

Run by ft-launcher with a short heartbeat timeout: the rank heartbeats for
STEPS all_reduces on cuda:0, then sleeps (a hang). The launcher takes its
stacks and its flight recorder before killing it.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ft_launcher_client import RankMonitorClient  # noqa: E402

STEPS = 12
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
c = RankMonitorClient()
c.init_workload_monitoring()
t = torch.ones(1 << 20, device="cuda")
for _ in range(STEPS):
    dist.all_reduce(t)
    torch.cuda.synchronize()
    c.send_heartbeat()
print("all_reduces done: %d; hanging" % STEPS, flush=True)
time.sleep(600)
