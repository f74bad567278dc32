"""A check for torch 2.x (not run by CI, whose Debian torch 1.13 names its
default group differently): after a first init_process_group that failed
(its store connection broken, as when a peer dies before the group forms),
InProcess._init_pg builds the group with a fresh rank of the next round.

torch 2.x bumps distributed_c10d._world.group_count, which names the default
group, before the rendezvous; without putting it back the retry's group is
"1" and the fresh rank's "0", and both time out waiting on keys the other
never writes (/default_pg/1//cpu//0/1 against /default_pg/0//cpu//0/0 under
Debian's torch 2.6). tests/test_inprocess.py's FailedInitTest checks the
same logic against a stand-in in CI.

Run with a torch 2.x python, e.g. in bench/trixie.sh's chroot:
  python3 client/python/tests/torch2_failed_init.py
Prints "exit codes [0, 0]" and exits 0 when both ranks built the group.
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))

if len(sys.argv) > 1:  # one rank: RANK BAD_PORT GOOD_PORT MARKER
    rank, bad, good, marker = sys.argv[1:5]
    sys.path.insert(0, os.path.join(HERE, ".."))
    import torch.distributed as dist
    from ft_launcher_client.inprocess import InProcess

    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      TORCHELASTIC_USE_AGENT_STORE="True")
    ip = InProcess(backend="gloo", timeout=30)
    if rank == "0":
        os.environ.update(MASTER_PORT=bad, TORCHELASTIC_RESTART_COUNT="0")
        try:
            ip._init_pg()
        except Exception as e:
            print("rank 0: first init failed: %r" % e, flush=True)
        open(marker, "w").close()
    os.environ.update(MASTER_PORT=good, TORCHELASTIC_RESTART_COUNT="1")
    ip._init_pg()
    dist.barrier()
    print("rank %s: group built, barrier passed" % rank, flush=True)
    sys.exit(0)

from torch.distributed import TCPStore  # noqa: E402

store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=90))
bad = socket.socket()
bad.bind(("127.0.0.1", 0))
bad.listen(8)


def close_every_connection():
    while True:
        c, _ = bad.accept()
        c.close()


threading.Thread(target=close_every_connection, daemon=True).start()
marker = os.path.join(tempfile.mkdtemp(), "failed-once")
args = [str(bad.getsockname()[1]), str(store.port), marker]
ranks = [subprocess.Popen([sys.executable, __file__, "0"] + args)]
while not os.path.exists(marker):  # the fresh rank comes once rank 0's first init failed
    time.sleep(0.1)
ranks.append(subprocess.Popen([sys.executable, __file__, "1"] + args))
codes = []
for p in ranks:
    try:
        codes.append(p.wait(timeout=90))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        codes.append("did not end")
print("exit codes", codes, flush=True)
sys.exit(0 if codes == [0, 0] else 1)
