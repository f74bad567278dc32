"""One gloo rank whose store is the Go server, reached the way torchelastic
ranks reach an agent store: init_method env:// with
TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE
and TORCHELASTIC_RESTART_COUNT in the environment.
"""
import datetime
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = sum(range(1, dist.get_world_size() + 1))
assert t.item() == expected, (t.item(), expected)
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} all_reduce {t.item():g}", flush=True)
