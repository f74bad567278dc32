"""Rank 1 dies while rank 0 is in a gloo all_reduce.

usage: python gloo_exit.py RANK PORT     (two processes by hand), or
       torchrun --nproc_per_node 2 --tee 3 gloo_exit.py   (console lines get "[default0]:" prefixes)
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def sync_grads(t):
    dist.all_reduce(t)
    return t


def main():
    if "RANK" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    else:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[2],
                                rank=int(sys.argv[1]), world_size=2, timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(1)
        os._exit(1)  # dies without a word
    print("rank %d: step 0" % rank, flush=True)
    sync_grads(torch.ones(1 << 20))


if __name__ == "__main__":
    main()
