#!/usr/bin/python3
"""A rank that speaks nvrx's own rank-monitor protocol, as nvrx's v0.6
RankMonitorClient does: 4-byte big-endian length + pickle of classes with
nvrx's module and class names (the stand-ins of monitor/nvrxwire/testdata;
nvrx itself cannot be installed here), replies read synchronously, none for
heartbeats/sections when the monitor advertises skip_section_response.

usage: nvrx_worker.py MODE
  hang       every rank heartbeats 5 times; rank 1 then stops heartbeating in
             restart cycle 0 (only its monitor can end it)
  shutdown   rank 0 asks the launcher for ShutdownWorkload over
             FT_LAUNCHER_IPC_SOCKET (nvrx's IpcConnector), then exits 1
  exclude    global rank 1, in restart cycle 0, asks for ExcludeThisNode
             and exits 1; every other rank sleeps 0.5 s and exits 0
  steady N   every rank heartbeats N times, 0.1 s apart, and exits 0
  slow F S   every rank heartbeats once, sleeps F s (a slow first step),
             heartbeats 15 times 50 ms apart, sleeps S s (a save it does
             not announce), heartbeats 15 more times and exits 0
  hang20     every rank heartbeats 20 times, 50 ms apart; rank 1 then
             stops heartbeating in restart cycle 0
"""
import os
import socket
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "monitor", "nvrxwire", "testdata")))

import standins as nv  # noqa: E402


send, recv = nv.send, nv.recv


def request(rank, action, description):
    """One workload-control request, as nvrx's IpcConnector sends it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FT_LAUNCHER_IPC_SOCKET"])
    send(s, (rank, nv.WorkloadControlRequest(action, description)))
    assert recv(s) == b"ok"
    s.close()


def main():
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    cycle = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if mode == "exclude":
        if rank == 1 and cycle == 0:
            request(rank, nv.WorkloadAction.ExcludeThisNode, "ECC errors on this node")
            return 1
        time.sleep(0.5)
        return 0
    if mode == "shutdown":
        if rank == 0:
            request(rank, nv.WorkloadAction.ShutdownWorkload, "loss is NaN")
            return 1
        time.sleep(60)
        return 0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
    send(s, nv.AuthkeyMsg(b"k" * 32))
    assert isinstance(recv(s), nv.OkMsg)
    init = nv.InitMsg()
    init.rank_info = nv.RankInfo(rank, int(os.environ["LOCAL_RANK"]), socket.gethostname(), os.getpid())
    init.iteration, init.num_warmup_iters = 0, 0
    send(s, init)
    cfg = recv(s).cfg

    def beat(n, pause):
        for _ in range(n):
            send(s, nv.HeartbeatMsg(rank, {}))
            if not cfg.skip_section_response:
                assert isinstance(recv(s), nv.OkMsg)
            time.sleep(pause)

    if mode == "slow":
        beat(1, float(sys.argv[2]))
        beat(15, 0.05)
        time.sleep(float(sys.argv[3]))
        beat(16, 0.05)
    elif mode == "steady":
        beat(int(sys.argv[2]), 0.1)
    elif mode == "hang20":
        beat(20, 0.05)
    else:
        beat(5, 0.05)
    if mode in ("hang", "hang20") and cycle == 0 and rank == 1:
        time.sleep(3600)
    s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
