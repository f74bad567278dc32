#!/usr/bin/python3
"""Ranks for the hostile-rank tests (integration/hostile_test.go).

usage: hostile_worker.py sections N OUTDIR
  Every rank writes its monitor socket path to OUTDIR/sock<local rank>, then
  opens and closes N distinct section names over nvrx (replies skipped, as
  nvrx >= 0.6 clients do), waits for the reply to an UpdateConfigMsg (so all
  of them were handled), writes OUTDIR/done<local rank> and sleeps.

usage: hostile_worker.py PROTOCOL VALUE SENTFILE
  Local rank 1 is hostile: it connects to its rank monitor with PROTOCOL
  ("native": FTL1 raw frames; "nvrx": nvrx pickles through the stand-in
  classes) and sends heartbeat and section timeouts updates carrying VALUE
  ("zero", "negative", "null", "nan", "inf", "1e300"; nan and inf only over
  nvrx, JSON has no such numbers), then creates SENTFILE<cycle> and sleeps.
  Local rank 0 heartbeats over nvrx until that file exists, then hangs:
  only its monitor can end it.
"""
import json
import os
import socket
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "monitor", "nvrxwire", "testdata")))

import standins as nv  # noqa: E402

VALUES = {"zero": 0.0, "negative": -5.0, "null": None, "nan": float("nan"), "inf": float("inf"), "1e300": 1e300}


def uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def frame(t, payload):
    return bytes([t]) + uvarint(len(payload)) + payload


def nvrx_session(rank):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
    nv.send(s, nv.AuthkeyMsg(b"k" * 32))
    assert isinstance(nv.recv(s), nv.OkMsg)
    init = nv.InitMsg()
    init.rank_info = nv.RankInfo(rank, int(os.environ["LOCAL_RANK"]), socket.gethostname(), os.getpid())
    init.iteration, init.num_warmup_iters = 0, 0
    nv.send(s, init)
    return s, nv.recv(s).cfg


def hostile(proto, value, rank):
    v = VALUES[value]
    if proto == "native":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
        hello = json.dumps({"global_rank": rank, "local_rank": 1, "pid": os.getpid()}).encode()
        s.sendall(b"FTL1" + frame(0x40, hello))
        s.recv(65536)  # the config
        for _ in range(20):
            s.sendall(frame(0x43, json.dumps({"heartbeat": {"initial": v, "subsequent": v, "were_calculated": True}}).encode()))
            s.sendall(frame(0x43, json.dumps({"section": {"section": {}, "out_of_section": v, "calculated_sections": [],
                                                          "is_out_of_section_calculated": True}}).encode()))
        time.sleep(0.5)  # the monitor reads native sessions in batches
        return s
    s, _ = nvrx_session(rank)
    for _ in range(20):
        nv.send(s, nv.UpdateConfigMsg(hb_timeouts=nv.HeartbeatTimeouts(v, v, True),
                                      section_timeouts=nv.SectionTimeouts({}, v, set(), True)))
        assert isinstance(nv.recv(s), nv.OkMsg)
    return s


def sections(n, outdir):
    local = os.environ["LOCAL_RANK"]
    with open(os.path.join(outdir, "sock" + local), "w") as f:
        f.write(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
    rank = int(os.environ["RANK"])
    s, cfg = nvrx_session(rank)
    for i in range(n):
        name = "hostile-section-%d" % i
        for action in (nv.SectionAction.OPEN, nv.SectionAction.CLOSE):
            nv.send(s, nv.SectionMsg(rank, name, action, None))
            if not cfg.skip_section_response:
                nv.recv(s)
    nv.send(s, nv.UpdateConfigMsg())  # always answered: everything before it was handled
    assert isinstance(nv.recv(s), nv.OkMsg)
    with open(os.path.join(outdir, "done" + local), "w") as f:
        f.write("ok")
    time.sleep(3600)
    return 0


def main():
    if sys.argv[1] == "sections":
        return sections(int(sys.argv[2]), sys.argv[3])
    proto, value, sent = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = int(os.environ["RANK"])
    sent += os.environ["TORCHELASTIC_RESTART_COUNT"]
    if int(os.environ["LOCAL_RANK"]) == 1:
        s = hostile(proto, value, rank)
        open(sent, "w").close()
        time.sleep(3600)
        s.close()
        return 0
    s, cfg = nvrx_session(rank)
    deadline = time.time() + 60
    beats = 0
    while (beats < 3 or not os.path.exists(sent)) and time.time() < deadline:
        beats += 1
        nv.send(s, nv.HeartbeatMsg(rank, {}))
        if not cfg.skip_section_response:
            assert isinstance(nv.recv(s), nv.OkMsg)
        time.sleep(0.1)
    time.sleep(3600)  # hung
    return 0


if __name__ == "__main__":
    sys.exit(main())
