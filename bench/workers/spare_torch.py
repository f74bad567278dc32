# bench/spare_prewarm.py's rank: stamps its first line ($OUT/start-ROUND-NODE-LOCAL),
# builds a gloo process group, does one all_reduce and stamps it
# ($OUT/step-ROUND-NODE-LOCAL); round 0 then waits to be stopped, later rounds exit 0.
import os
import time

t0 = time.time()
e = os.environ
tag = "%s-%s-%s" % (e["TORCHELASTIC_RESTART_COUNT"], e["NODE"], e["LOCAL_RANK"])


def stamp(name, t):
    p = os.path.join(e["OUT"], "%s-%s" % (name, tag))
    with open(p + ".tmp", "w") as f:
        f.write(repr(t))
    os.rename(p + ".tmp", p)


stamp("start", t0)
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
stamp("step", time.time())
if e["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(600)
dist.destroy_process_group()
