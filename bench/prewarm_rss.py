#!/usr/bin/python3
"""Memory of one --prewarm standby (RSS, anonymous and file-backed, and its
threads) for several --prewarm settings, with 2 local ranks whose script
imports what examples/ddp_train.py imports (torch, torch.distributed,
torch.nn, DDP) and makes its calls that import more on torch 2.x
(use_deterministic_algorithms, Adam).

For --prewarm auto both its standbys are measured: those of the first cycle
(nothing learned yet: the built-in list) and those started after the first
restart (the list learned from the first cycle's ranks).

usage: bench/prewarm_rss.py [--ft-launcher PATH] [--python PATH]
                            [--lists 'auto;torch,torch.distributed;...']
Prints a markdown table on stdout.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# The calls examples/ddp_train.py makes before its first step: on torch 2.x
# they import the compiler stack (torch._dynamo, ...), which --prewarm auto
# then learns; on torch 1.13 `import torch` already imported what they use.
RANK = """import os, sys, time
import torch, torch.distributed, torch.nn
from torch.nn.parallel import DistributedDataParallel
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=0.1)
rnd = os.environ["TORCHELASTIC_RESTART_COUNT"]
while not os.path.exists(os.path.join(os.environ["OUT"], "go-" + rnd)):
    time.sleep(0.05)
sys.exit(1 if rnd == "0" else 0)
"""

BEST = ("torch,torch.distributed,torch._decomp,torch._dynamo,torch._functorch,torch._higher_order_ops,"
        "torch._inductor,torch._numpy,torch.compiler,torch.cuda,torch.fx,torch.nn,torch.onnx,torch.testing,torch.utils")


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                out[k] = int(v.split()[0])
    return out


def ready(events, n, deadline):
    while time.monotonic() < deadline:
        try:
            with open(events) as f:
                evs = [json.loads(x) for x in f if x.strip()]
        except FileNotFoundError:
            evs = []
        r = [e for e in evs if e.get("event") == "prewarm_ready"]
        if len(r) >= n:
            return r[:n]
        time.sleep(0.1)
    raise RuntimeError(f"fewer than {n} standbys ready")


def measure(a, modules, d):
    script = os.path.join(d, "rank.py")
    with open(script, "w") as f:
        f.write(RANK)
    events = os.path.join(d, "events.jsonl")
    env = dict(os.environ, OUT=d, PYTHON_EXEC=a.python, XDG_STATE_HOME=os.path.join(d, "state"), OMP_NUM_THREADS="1")
    p = subprocess.Popen([a.ft_launcher, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                          "--prewarm", modules, "--event-log", events, script],
                         env=env, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        deadline = time.monotonic() + 300
        first = ready(events, 2, deadline)
        rows.append(("first cycle" if modules == "auto" else "", [status(e["pid"]) for e in first], first))
        open(os.path.join(d, "go-0"), "w").close()
        if modules == "auto":
            later = ready(events, 4, deadline)[2:]
            rows.append(("after learning", [status(e["pid"]) for e in later], later))
        open(os.path.join(d, "go-1"), "w").close()
        p.wait(120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--lists", default="auto;torch,torch.distributed",
                    help="';'-separated --prewarm values (e.g. add the torch 2.x list: " + BEST + ")")
    a = ap.parse_args()
    print("| --prewarm | standbys | RSS MiB (each) | anonymous MiB | file-backed MiB | threads | import CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for modules in a.lists.split(";"):
        with tempfile.TemporaryDirectory(prefix="ftbench-rss.") as d:
            try:
                rows = measure(a, modules, d)
            except RuntimeError as e:  # e.g. a list this torch cannot import: no standby gets ready
                print(f"| {modules[:40]} | failed: {e} | | | | | |")
                continue
            for what, st, evs in rows:
                name = modules if len(modules) < 40 else "hand-written list (15 modules)"
                mib = lambda k: "/".join(f"{s[k] / 1024:.0f}" for s in st)  # noqa: E731
                cpu = "/".join(f"{e['import_cpu_ms'] / 1000:.2f}" for e in evs)
                print(f"| {name} | {what} | {mib('VmRSS')} | {mib('RssAnon')} | {mib('RssFile')} "
                      f"| {'/'.join(str(s['Threads']) for s in st)} | {cpu} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
