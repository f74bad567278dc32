"""Where a rank's CUDA start-up time goes: each call of the example's
setup_device timed on its own. --like-example first does what
examples/ddp_train.py does before it (torch.nn and DDP imported, one
intra-op thread, deterministic algorithms). Prints one JSON line (rank 0 of a
launched job, or the only process)."""
import json
import os
import sys
import time

t = [("start", time.monotonic())]


def mark(name):
    t.append((name, time.monotonic()))


import torch  # noqa: E402

mark("import torch")
if "--like-example" in sys.argv:
    import torch.distributed  # noqa: F401
    import torch.nn  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    mark("example's imports and settings")
torch.cuda.is_available()
mark("is_available")
n = torch.cuda.device_count()
mark("device_count")
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % n)
torch.cuda.set_device(dev)
mark("set_device")
torch.zeros(1, device=dev)
mark("zeros (context)")
torch.cuda.synchronize(dev)
mark("synchronize")
out = {name: round(b - a, 3) for (_, a), (name, b) in zip(t, t[1:])}
out["rank"] = os.environ.get("RANK")
out["env"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "CUDA_MODULE_LOADING", "CUBLAS_WORKSPACE_CONFIG",
                                              "CUDA_VISIBLE_DEVICES", "NCCL_ASYNC_ERROR_HANDLING")}
print(json.dumps(out), flush=True)
