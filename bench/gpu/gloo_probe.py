"""Smallest gloo-on-CUDA job, to tell a launcher's hang from the example's:
each rank joins the process group (env://), all-reduces a CUDA tensor 20
times, builds DDP on a small model and takes 5 steps, printing each stage
with its time. Python stacks are printed after 30 s (faulthandler), then the
rank exits 3. Used by bench/gpu/run.sh before the benchmark:
  torchrun --standalone --nproc_per_node 2 bench/gpu/gloo_probe.py
"""
import faulthandler
import os
import sys
import time

faulthandler.dump_traceback_later(30, exit=True)
t0 = time.time()
rank = os.environ.get("RANK", "?")


def say(msg):
    print(f"[gloo_probe rank {rank} +{time.time() - t0:.2f}s] {msg}", flush=True)


say("env " + " ".join(f"{k}={os.environ.get(k)}" for k in (
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
torch.cuda.set_device(dev)
torch.zeros(1, device=dev)
say("CUDA context")
dist.init_process_group("gloo")
say("process group")
x = torch.ones(1024, device=dev)
for _ in range(20):
    dist.all_reduce(x)
torch.cuda.synchronize()
say(f"20 all_reduce on CUDA, x[0]={x[0].item():.0f}")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 256, device=dev)).sum().backward()
    opt.step()
torch.cuda.synchronize()
say("5 DDP steps")
dist.barrier()
dist.destroy_process_group()
say("done")
sys.exit(0)
