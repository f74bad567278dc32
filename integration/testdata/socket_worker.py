#!/usr/bin/python3
"""A rank with every launcher feature in use, for the socket inventory
(integration/sockets_test.go): torch.distributed over gloo through the
launcher's agent store, heartbeats to its rank monitor, a save into the
launcher's memory (replicated to a buddy node) after every step.

It also listens on a TCP socket of its own (127.0.0.1, a free port), as a
training's sockets do (gloo's, a TCPStore it hosts): the test must list it
as the training's and not judge it.

Once its process group has all-reduced, it writes $OUT/up-<RANK> (its pid
and that port) and goes on with steps, a heartbeat and a save each, until
$OUT/release exists; then it exits 0.
"""
import os
import socket
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

from ft_launcher_client import RankMonitorClient, state  # noqa: E402

out = os.environ["OUT"]
rank = int(os.environ["RANK"])
mon = RankMonitorClient()
mon.init_workload_monitoring()

dist.init_process_group("gloo")
t = torch.ones(4) * (rank + 1)
dist.all_reduce(t)
ws = dist.get_world_size()
assert t[0].item() == ws * (ws + 1) / 2, t

own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen(1)

step, _ = state.load()
step = 0 if step is None else step + 1
up = os.path.join(out, "up-%d" % rank)
while not os.path.exists(os.path.join(out, "release")):
    mon.send_heartbeat()
    state.save(step, {"t": t, "step": step}, monitor=mon)
    if step == 0:
        with open(up + ".tmp", "w") as f:
            f.write("%d %d\n" % (os.getpid(), own.getsockname()[1]))
        os.rename(up + ".tmp", up)
    step += 1
    time.sleep(0.2)

own.close()
dist.barrier()
dist.destroy_process_group()
mon.shutdown_workload_monitoring()
