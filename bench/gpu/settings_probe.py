"""Which of examples/ddp_train.py's start-up calls costs the seconds before
its CUDA context: the imports, torch.set_num_threads(1) and
torch.use_deterministic_algorithms(True) and the first optimizer's
construction timed one by one, with the torch modules each pulled in (on
torch 2.x either may import torch._dynamo: 1.3 s on this 2-core machine
under Debian's torch 2.6). Prints one JSON line, then PREWARM_EXTRA=<the
packages those two calls imported>, for --prewarm."""
import json
import sys
import time

out = {}


def timed(name, fn):
    before = set(sys.modules)
    t = time.monotonic()
    fn()
    out[name] = {"s": round(time.monotonic() - t, 3),
                 "new_modules": len(set(sys.modules) - before),
                 "new_packages": sorted({".".join(m.split(".")[:2]) for m in set(sys.modules) - before
                                         if m.startswith("torch.")})[:30]}


def imp(name):
    return lambda: __import__(name)


timed("import torch", imp("torch"))
import torch  # noqa: E402

timed("import torch.distributed", imp("torch.distributed"))
timed("import torch.nn.parallel (DDP)", imp("torch.nn.parallel"))
timed("set_num_threads(1)", lambda: torch.set_num_threads(1))
timed("use_deterministic_algorithms(True)", lambda: torch.use_deterministic_algorithms(True))
timed("torch.optim.Adam(...)", lambda: torch.optim.Adam(torch.nn.Linear(2, 2).parameters()))
out["cuda_initialized"] = torch.cuda.is_initialized()
print(json.dumps(out), flush=True)
extra = out["use_deterministic_algorithms(True)"]["new_packages"] + out["torch.optim.Adam(...)"]["new_packages"]
print("PREWARM_EXTRA=" + ",".join(sorted(set(extra))))
