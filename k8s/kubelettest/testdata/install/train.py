"""The train.py of deploy/examples/appwrapper.yaml in TestShippedInstall.

The lane's training image has Python but no torch, so this rank trains
nothing: it says which rank of which world it is and after how many of the
AppWrapper's resets, and steps until it is stopped.
"""
import os
import time

rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
resets = os.environ.get("FTL_WORKLOAD_RESETS", "?")
step = 0
while True:
    print(f"train.py: rank {rank} of {world} resets {resets} step {step}", flush=True)
    step += 1
    time.sleep(1)
