"""What a standby would save by initialising the CUDA driver (cuInit, no
context) before it becomes a rank: in a fresh process, cuInit(0)
through libcuda alone, the device memory the process then holds
(nvidia-smi's per-process figure; none is expected without a context), and
then what the rank would still pay: torch's is_available() and its first
context. With --no-cuinit the same process skips cuInit, for the
side-by-side. Prints one JSON line."""
import ctypes
import json
import os
import sys
import time

from nvsmi import used_mib

res = {}
if "--no-cuinit" not in sys.argv:
    t0 = time.monotonic()
    lib = ctypes.CDLL("libcuda.so.1")
    rc = lib.cuInit(0)
    res["cuinit_s"] = round(time.monotonic() - t0, 4)
    res["cuinit_rc"] = rc
    res["mib_after_cuinit"] = used_mib(os.getpid()) or 0
t0 = time.monotonic()
import torch  # noqa: E402
res["import_s"] = round(time.monotonic() - t0, 3)
t0 = time.monotonic()
torch.cuda.is_available()
res["is_available_s"] = round(time.monotonic() - t0, 4)
t0 = time.monotonic()
torch.cuda.set_device(0)
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
res["context_s"] = round(time.monotonic() - t0, 4)
res["mib_after_context"] = used_mib(os.getpid()) or 0
res["torch"] = torch.__version__
print(json.dumps(res), flush=True)
