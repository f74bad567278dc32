#!/usr/bin/python3
"""Dump this worker's environment and process identity as JSON.

usage: print_env.py OUT_PATH [EXTRA_ARGS...]
OUT_PATH usually carries ${local_rank}, which the launcher substitutes. The
file is written atomically (temp file + rename) so a reader never sees half.
JSON keys: env, argv, pid, ppid, pgid, sid, cwd.
"""
import json
import os
import sys


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    doc = {
        "env": dict(os.environ),
        "argv": sys.argv,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "cwd": os.getcwd(),
    }
    tmp = f"{out}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
