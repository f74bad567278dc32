#!/usr/bin/python3
"""What --prewarm auto changes for multiprocessing and sys.argv: one local
rank (bench/workers/prewarm_mp_rank.py) through 3 cycles, cold, warm on the
built-in list and warm on the learned list. Each cycle runs worker pools
with the spawn, forkserver and fork start methods (with --dataloader also
a torch DataLoader with 2 workers per method) and records what the workers
saw, and what sys.argv was at import for the script and for ftl_argvlib, a
library on PYTHONPATH outside the script's directory.

usage: bench/prewarm_mp.py [--ft-launcher PATH] [--python PATH] [--dataloader]
Prints one summary line per cycle; exits 1 if a worker failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "prewarm_mp_rank.py")
LAST = 2


def events(path, kind):
    try:
        with open(path) as f:
            return [e for e in map(json.loads, f) if e.get("event") == kind]
    except FileNotFoundError:
        return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--dataloader", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftbench-mp.") as out:
        lib, run = os.path.join(out, "lib"), os.path.join(out, "run")  # lib outside the working directory:
        os.mkdir(lib)                                                   # else it counts as the user's code
        os.mkdir(run)
        with open(os.path.join(lib, "ftl_argvlib.py"), "w") as f:
            f.write("import sys\nARGV = list(sys.argv)  # a library that reads sys.argv at import\n")
        env = dict(os.environ, OUT=out, LAST=str(LAST), PYTHON_EXEC=a.python, PYTHONPATH=lib,
                   XDG_STATE_HOME=os.path.join(out, "state"))
        if a.dataloader:
            env["DATALOADER"] = "1"
        ev = os.path.join(out, "events.jsonl")
        log = open(os.path.join(out, "launcher.log"), "w")
        p = subprocess.Popen([a.ft_launcher, "--standalone", "--nproc-per-node", "1", "--max-restarts", str(LAST),
                              "--prewarm", "auto", "--event-log", ev, RANK, "--lr", "0.1", "extra arg"],
                             env=env, cwd=run, stdout=log, stderr=subprocess.STDOUT)
        try:
            for r in range(LAST):  # cycle r+1 starts on the standby started after cycle r
                while len(events(ev, "prewarm_ready")) < r + 1 or not os.path.exists(os.path.join(out, "rec-%d.json" % r)):
                    if p.poll() is not None:
                        sys.exit("launcher exited %d:\n%s" % (p.returncode, open(log.name).read()))
                    time.sleep(0.1)
                open(os.path.join(out, "go-%d" % r), "w").close()
            rc = p.wait(600)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        print("launcher exit", rc, "; warm cycles", [e.get("round") for e in events(ev, "prewarm_started")])
        bad = rc != 0
        for r in range(LAST + 1):
            with open(os.path.join(out, "rec-%d.json" % r)) as f:
                d = json.load(f)
            res = {}
            for k, v in d.items():
                if k in ("spawn", "forkserver", "fork"):
                    ok = isinstance(v, list) and [w["x"] for w in v] == [1, 4] and all(
                        w["argv"] == d["argv"] and w["pythonpath"] == lib and w["report"] is None and not w["hook_path"] for w in v)
                    res[k] = "ok" if ok else v
                    bad |= not ok
                elif k.startswith("dl_") and not k.endswith("_s"):
                    ok = v == [[0, 1], [2, 3], [4, 5], [6, 7]]
                    res[k] = "ok %.1fs" % d[k + "_s"] if ok else v
                    bad |= not ok
            print("cycle %d: pre-imported %s; script argv at import %s; ftl_argvlib.ARGV %s; %s"
                  % (r, d["pre"], d["argv_at_import"], [x if len(x) < 60 else x[:40] + "..." for x in d["argvlib"]], res))
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
