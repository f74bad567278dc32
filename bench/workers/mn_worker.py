#!/usr/bin/python3 -S
"""Multi-node benchmark worker: a stand-in for a training rank, stdlib only.

usage: mn_worker.py LOG NODE MODE [CRASH_NODE CRASH_LOCAL_RANK CRASH_DELAY]

It behaves like a rank whose collectives run over TCP with async error
handling: global rank 0 listens on MASTER_ADDR:MASTER_PORT, every other rank
keeps one connection to it, rank 0 sends a byte to each peer every 50 ms and
each peer answers. A rank exits 1 when a peer it talks to has been silent for
SILENCE (1 s), or when the group does not form within JOIN_BOUND.

MODE says how a closed connection counts:
  poweroff  EOF is ignored and only silence counts: a powered-off host sends
            no FIN, but on one machine the kernel closes a SIGKILLed process's
            sockets at once, which would make detection unrealistically fast.
  crash     EOF or a reset is a failure at once, as when a peer process dies
            on a live host.

Lines appended to LOG (one write each, O_APPEND, so ranks never interleave):
  <ns> start <node> <rank> <restart_count> <world> <master:port> <pid>
  <ns> ready <node> <rank> <restart_count> <world> <master:port>   (rank 0,
       once every peer is connected)
  <ns> crash <node> <rank>   (the injected fault, in restart count 0 only)
  <ns> lost <node> <rank> <reason>   (just before exiting 1)
With CRASH_* given, local rank CRASH_LOCAL_RANK of node CRASH_NODE exits 1
CRASH_DELAY seconds after its group is ready, in the first cycle only.
"""
import os
import select
import socket
import sys
import time

PING_S = 0.05
SILENCE_S = 1.0
JOIN_BOUND_S = 90.0


def stamp(fd, *fields):
    os.write(fd, (" ".join([str(time.time_ns()), *map(str, fields)]) + "\n").encode())


def main():
    log, node, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    crash = sys.argv[4:7]
    eof_fails = mode == "crash"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = os.environ.get("LOCAL_RANK", "?")
    cycle = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stamp(fd, "start", node, rank, cycle, world, f"{addr}:{port}", os.getpid())

    crash_at = None
    if crash and crash[0] == node and crash[1] == local_rank and cycle == "0":
        crash_at = float(crash[2])

    def lost(reason):
        stamp(fd, "lost", node, rank, reason)
        sys.exit(1)

    join_deadline = time.monotonic() + JOIN_BOUND_S
    if rank == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((socket.gethostbyname(addr), port))
        srv.listen(world)
        peers = {}  # socket -> monotonic time of its last byte
        while len(peers) < world - 1:
            left = join_deadline - time.monotonic()
            if left <= 0:
                lost(f"join-timeout({len(peers)}/{world - 1})")
            srv.settimeout(left)
            try:
                c, _ = srv.accept()
            except socket.timeout:
                continue
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peers[c] = time.monotonic()
        srv.close()
        stamp(fd, "ready", node, rank, cycle, world, f"{addr}:{port}")
        ready = time.monotonic()
        for c in peers:
            peers[c] = ready
        closed = set()
        next_ping = ready
        while True:
            now = time.monotonic()
            if crash_at is not None and now - ready >= crash_at:
                stamp(fd, "crash", node, rank)
                sys.exit(1)
            if now >= next_ping:
                for c in peers:
                    if c not in closed:
                        try:
                            c.send(b"p")
                        except OSError:
                            if eof_fails:
                                lost("send-error")
                            closed.add(c)
                next_ping = now + PING_S
            for c, last in peers.items():
                if now - last > SILENCE_S:
                    lost("silence")
            live = [c for c in peers if c not in closed]
            r, _, _ = select.select(live, [], [], max(0.0, next_ping - time.monotonic()))
            for c in r:
                try:
                    b = c.recv(64)
                except OSError:
                    b = b""
                if b:
                    peers[c] = time.monotonic()
                elif eof_fails:
                    lost("eof")
                else:
                    closed.add(c)  # silence decides
    else:
        while True:
            try:
                s = socket.create_connection((addr, port), timeout=1.0)
                break
            except OSError:
                if time.monotonic() > join_deadline:
                    lost("connect-timeout")
                time.sleep(0.02)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        last = time.monotonic()
        started = None
        eof = False
        while True:
            now = time.monotonic()
            if crash_at is not None and started is not None and now - started >= crash_at:
                stamp(fd, "crash", node, rank)
                sys.exit(1)
            # Before the first ping the group may still be forming: wait for
            # it within the join bound, not the silence bound.
            bound = join_deadline if started is None else last + SILENCE_S
            if now > bound:
                lost("silence" if started is not None else "join-timeout")
            wait = bound - now
            if crash_at is not None and started is not None:
                wait = min(wait, started + crash_at - now)
            if eof:
                time.sleep(max(0.0, min(wait, PING_S)))
                continue
            r, _, _ = select.select([s], [], [], max(0.0, wait))
            if not r:
                continue
            try:
                b = s.recv(64)
            except OSError:
                b = b""
            if not b:
                if eof_fails:
                    lost("eof")
                eof = True  # silence decides
                continue
            last = time.monotonic()
            if started is None:
                started = last
            try:
                s.send(b"a")
            except OSError:
                if eof_fails:
                    lost("send-error")


if __name__ == "__main__":
    main()
