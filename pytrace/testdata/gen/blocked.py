"""A rank that blocks forever, dumpable from outside with SIGRTMIN+3.

usage: DUMP_FILE=out READY_FILE=ready python blocked.py lock|fifo|gloo|gloo-peer|deep [port]
"""
import faulthandler
import os
import signal
import sys
import threading
import time

dump = open(os.environ["DUMP_FILE"], "a")
faulthandler.register(signal.SIGRTMIN + 3, file=dump, all_threads=True, chain=False)


def ready():
    with open(os.environ["READY_FILE"], "w") as f:
        f.write(str(os.getpid()))


def heartbeat(stop):
    while not stop.wait(0.5):
        pass


def block_lock():
    lock = threading.Lock()
    lock.acquire()
    ready()
    lock.acquire()  # deadlock


def block_fifo():
    path = os.environ["FIFO"]
    fd = os.open(path, os.O_RDWR)
    ready()
    data = os.read(fd, 1)  # nobody ever writes
    return data


def init_gloo(rank):
    from datetime import timedelta

    import torch.distributed as dist
    dist.init_process_group(
        "gloo",
        init_method="tcp://127.0.0.1:%s" % sys.argv[2],
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=600),
    )
    return dist


def block_gloo():
    import torch
    dist = init_gloo(0)
    t = torch.ones(4)
    ready()
    dist.all_reduce(t)  # the peer never joins
    return t


def block_gloo_peer():
    init_gloo(1)
    ready()
    while True:
        time.sleep(1)  # stuck in user code, never calls all_reduce


def recurse(n):
    if n == 0:
        ready()
        while True:
            time.sleep(1)
    return recurse(n - 1)


def main():
    stop = threading.Event()
    hb = threading.Thread(target=heartbeat, args=(stop,), name="heartbeat", daemon=True)
    hb.start()
    mode = sys.argv[1]
    if mode == "lock":
        block_lock()
    elif mode == "fifo":
        block_fifo()
    elif mode == "gloo":
        block_gloo()
    elif mode == "gloo-peer":
        block_gloo_peer()
    elif mode == "deep":
        recurse(150)


if __name__ == "__main__":
    main()
