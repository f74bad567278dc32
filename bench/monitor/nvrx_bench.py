"""Per-call cost of the nvrx wire path as seen from Python.

Uses the stand-in classes with nvrx's module/class names
(monitor/nvrxwire/testdata/standins.py) and does what nvrx's rank client does
when the monitor advertises skip_section_response=True: pickle the message,
prefix a 4-byte big-endian length, sendall on the Unix socket, no reply.
Run under a live monitor: `monbench client python3 bench/monitor/nvrx_bench.py [N]`.
Prints one JSON line (p50/p99 in µs).
"""

import json
import os
import pickle
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "monitor", "nvrxwire", "testdata"))
import standins as st  # noqa: E402


send, recv = st.send, st.recv


def pct(xs):
    xs.sort()
    return xs[len(xs) // 2] / 1000.0, xs[min(len(xs) - 1, len(xs) * 99 // 100)] / 1000.0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
    send(s, st.AuthkeyMsg(b"k" * 32))
    recv(s)
    info = st.RankInfo(global_rank=0, local_rank=0, host="h", pid=os.getpid())
    send(s, st.shaped(st.InitMsg, rank_info=info, iteration=0, num_warmup_iters=1))
    cfg = recv(s).cfg
    assert cfg.skip_section_response, "monitor did not advertise skip_section_response"
    clock = time.perf_counter_ns
    hb = []
    for _ in range(n):
        t0 = clock()
        send(s, st.HeartbeatMsg(0, {}))
        hb.append(clock() - t0)
    sec = []
    for i in range(n):
        t0 = clock()
        send(s, st.SectionMsg(0, "step", st.SectionAction.OPEN, i))
        send(s, st.SectionMsg(0, "step", st.SectionAction.CLOSE, i))
        sec.append(clock() - t0)
    hb_size = len(pickle.dumps(st.HeartbeatMsg(0, {}))) + 4
    s.close()
    h50, h99 = pct(hb)
    s50, s99 = pct(sec)
    print(json.dumps({"n": n, "heartbeat_bytes": hb_size, "heartbeat_p50_us": h50, "heartbeat_p99_us": h99,
                      "section_open_close_p50_us": s50, "section_open_close_p99_us": s99}))


if __name__ == "__main__":
    main()
