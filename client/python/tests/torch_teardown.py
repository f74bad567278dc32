"""One rank of TestTeardownEndsPeersCollective (inprocess_test.go), with
real torch and gloo: does InProcess's teardown end a peer's collective even
when the destroyed group stays alive?

torch 2.6 keeps a destroyed process group alive (references held outside
Python's reach: measured under Debian trixie's torch 2.6, docs/inprocess.md)
and with it its gloo connections, so a peer blocked in a collective that
waits on this rank never fails. torch 1.13 (here) frees the group; the
script keeps a reference to it, as torch 2.6 does, so the case is the same.

  rank 1: all_reduce on the group, which rank 0 never joins: it blocks
          until rank 0's teardown ends the connection, then prints
          "collective failed: <error>" and exits 0.
  rank 0: waits until rank 1 is inside the collective, tears the group
          down with InProcess._teardown, prints "torn down", then stays
          alive (its sockets open, were they not shut down) until the file
          DIR/done appears.

The group's timeout is 300 s, so only the teardown can end the collective
within the Go test's deadline. usage: torch_teardown.py RANK PORT DIR
"""
import os
import sys
import time

rank, port, d = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "LOCAL_RANK": str(rank)})
os.environ.pop("FT_RANK_MONITOR_SOCKET", None)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ft_launcher_client.inprocess import InProcess  # noqa: E402

ip = InProcess(backend="gloo", timeout=300)
ip._init_pg()
group = dist.group.WORLD  # held, as torch 2.6 holds it after destroy_process_group
entered = os.path.join(d, "entered")
if rank == 1:
    dist.barrier()
    open(entered, "w").close()
    try:
        dist.all_reduce(torch.ones(4))
        print("collective returned", flush=True)
        sys.exit(1)
    except RuntimeError as e:
        print("collective failed: %s" % e, flush=True)
        sys.exit(0)
dist.barrier()
while not os.path.exists(entered):
    time.sleep(0.01)
time.sleep(0.5)  # rank 1 is inside all_reduce by now (a later start fails the same way)
n = len(ip._pg_sockets)
if n == 0:
    print("no sockets recorded by _init_pg", flush=True)
    sys.exit(1)
ip._teardown()
print("torn down (%d sockets opened by init_process_group)" % n, flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(d, "done")) and time.monotonic() < deadline:
    time.sleep(0.05)
