#!/usr/bin/python3
"""Sleep until killed; optionally write the pid to PID_FILE first.

usage: sleep_forever.py [PID_FILE]
"""
import os
import sys
import time

if len(sys.argv) > 1:
    tmp = f"{sys.argv[1]}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, sys.argv[1])
while True:
    time.sleep(3600)
