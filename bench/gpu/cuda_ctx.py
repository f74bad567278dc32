"""What a standby would save and cost by creating its CUDA context in
advance: one process's import of torch, its CUDA context creation, and the
device memory the context holds (nvidia-smi's per-process figure), then a
second context in the same GPU while the first is held (a standby beside a
rank). Prints one JSON line."""
import json
import os
import subprocess
import sys
import time

from nvsmi import used_mib

t0 = time.monotonic()
import torch  # noqa: E402

t_import = time.monotonic() - t0



t1 = time.monotonic()
torch.cuda.set_device(0)
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t_ctx = time.monotonic() - t1
res = {"import_s": round(t_import, 3), "context_s": round(t_ctx, 3), "context_mib": used_mib(os.getpid()),
       "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
if len(sys.argv) > 1 and sys.argv[1] == "child":
    print(json.dumps(res), flush=True)
    sys.exit(0)
# A second process's context while this one holds its own.
child = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True)
res["second_process"] = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else child.stderr[-500:]
# The first kernel after the context: cuBLAS handle and a matmul.
t2 = time.monotonic()
a = torch.randn(1024, 1024, device="cuda")
(a @ a).sum().item()
res["first_matmul_s"] = round(time.monotonic() - t2, 3)
res["context_plus_cublas_mib"] = used_mib(os.getpid())
print(json.dumps(res), flush=True)
