#!/usr/bin/python3
"""Crash -> first training step after the restart, side by side:
torchrun, ft-launcher (cold) and ft-launcher --prewarm.

Every launcher runs examples/ddp_train.py (gloo, CPU) through
bench/workers/ddp_probe.py, which stamps the phases of each rank. Rank 1
crashes (os._exit(1)) before step 25 of cycle 0 (the step sleep leaves the
standbys time to import torch first); training resumes from the step-20
checkpoint. Measured from the crash stamp, as the maximum over ranks of
cycle 1's stamps: launcher (crash -> user code of every rank running),
imports (torch, torch.distributed, torch.nn), process group
(init_process_group), checkpoint (torch.load) and first step (DDP
construction, forward, backward, optimizer step).

usage: bench/prewarm.py [--ft-launcher PATH] [--torchrun CMD] [--reps N]
                        [--nproc N] [--prewarm MODULES] [--kinds K,K...]
Prints a markdown table on stdout; progress and failures on stderr.
"""
import argparse
import os
import shlex
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench import DEFAULT_TORCHRUN, Run, pct, progress, read_lines  # noqa: E402

PROBE = os.path.join(HERE, "workers", "ddp_probe.py")
PYTHON = "/usr/bin/python3"
PHASES = ["start", "imports", "pg", "ckpt", "step"]
KINDS = ["torchrun", "ft-launcher", "ft-launcher --prewarm"]  # the default comparison
COLUMNS = ["launcher", "imports", "process group", "checkpoint", "first step"]


def command(kind, a, nproc, workdir, tag):
    train = ["--ckpt-dir", os.path.join(workdir, tag + ".ckpt"), "--out", os.path.join(workdir, tag + ".json"),
             "--steps", "30", "--crash-at-step", "25", "--crash-rank", "1", "--step-sleep", str(a.step_sleep)]
    logs = os.path.join(workdir, tag + ".logs")
    if kind == "torchrun":
        return shlex.split(a.torchrun) + [
            "--standalone", "--nproc_per_node", str(nproc), "--max_restarts", "1",
            "--monitor_interval", "0.1", "--log_dir", logs, PROBE] + train
    line = [a.ft_launcher, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "1",
            "--monitor-interval", "0.1", "--log-dir", logs]
    # The kind's own flags: "ft-launcher --prewarm --agent-store off".
    for f in kind.split()[1:]:
        line.append(f)
        if f == "--prewarm":
            line.append(a.prewarm)
    return line + [PROBE] + train


def once(kind, a, nproc, workdir, tag):
    stamps = os.path.join(workdir, tag + ".stamps")
    os.environ["PROBE_STAMPS"] = stamps
    os.environ["PYTHON_EXEC"] = PYTHON
    run = Run(command(kind, a, nproc, workdir, tag), workdir, tag)
    try:
        rc = run.wait(300)
        if rc != 0:
            raise RuntimeError(f"{kind} exited {rc}:\n{run.tail()}")
    finally:
        run.stop()
    lines = read_lines(stamps)
    crash = [int(f[0]) for f in lines if f[1] == "crash"]
    after = {}
    for f in lines:
        if f[3] == "1" and f[1] in PHASES:
            after.setdefault(f[1], {})[f[2]] = int(f[0])
    if len(crash) != 1 or any(len(after.get(p, {})) != nproc for p in PHASES):
        raise RuntimeError(f"{kind}: incomplete stamps in {stamps}")
    ends = [max(after[p].values()) - crash[0] for p in PHASES]  # cumulative, ns
    return [ends[0]] + [ends[i] - ends[i - 1] for i in range(1, len(ends))] + [ends[-1]]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    p.add_argument("--torchrun", default=os.environ.get("TORCHRUN", DEFAULT_TORCHRUN))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--nproc", default="2,4", help="comma-separated rank counts")
    p.add_argument("--prewarm", default="torch,torch.distributed")
    p.add_argument("--step-sleep", type=float, default=0.5)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="comma-separated launchers to compare: torchrun, or ft-launcher followed by its flags "
                        "(e.g. 'ft-launcher,ft-launcher --agent-store off': the agent store against the rank-0 store)")
    a = p.parse_args()
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    for k in kinds:
        if k != "torchrun" and k.split()[0] != "ft-launcher":
            p.error(f"--kinds: {k!r}: must be torchrun or ft-launcher [FLAGS]")
    print(f"Host: {os.cpu_count()} CPUs, `{os.uname().release}`; reps={a.reps}; "
          f"date {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    failures = []
    with tempfile.TemporaryDirectory(prefix="ftbench-prewarm.") as workdir:
        for nproc in [int(n) for n in a.nproc.split(",")]:
            res = {k: [] for k in kinds}
            for i in range(a.reps):
                for k in kinds:
                    tag = f"{k.replace(' ', '').replace('-', '')}-{nproc}-{i}"
                    try:
                        res[k].append(once(k, a, nproc, workdir, tag))
                    except Exception as e:  # report, keep measuring
                        failures.append(f"{tag}: {e}")
                        progress(f"FAILED {tag}: {e}")
                progress(f"nproc {nproc}: rep {i + 1}/{a.reps} done")
            print(f"### Crash -> first training step after restart, examples/ddp_train.py, {nproc} ranks (s, p50)\n")
            print("| launcher | n | total (min-max) | " + " | ".join(COLUMNS) + " |")
            print("|---|---:|---:|" + "---:|" * len(COLUMNS))
            for k, v in res.items():
                if not v:
                    continue
                tot = [x[-1] / 1e9 for x in v]
                cols = [f"{pct([x[j] / 1e9 for x in v], .5):.2f}" for j in range(len(COLUMNS))]
                print(f"| {k} | {len(v)} | {pct(tot, .5):.2f} ({min(tot):.2f}-{max(tot):.2f}) | " + " | ".join(cols) + " |")
            if res.get("ft-launcher") and res.get("ft-launcher --agent-store off"):
                ratio = pct([x[-1] for x in res["ft-launcher --agent-store off"]], .5) / pct([x[-1] for x in res["ft-launcher"]], .5)
                print(f"\nagent store vs rank-0 store (--agent-store off): {ratio:.2f}x (p50 totals; above 1 is faster)")
            if res.get("torchrun") and res.get("ft-launcher --prewarm"):
                ratio = pct([x[-1] for x in res["torchrun"]], .5) / pct([x[-1] for x in res["ft-launcher --prewarm"]], .5)
                print(f"\n--prewarm vs torchrun: {ratio:.1f}x faster (p50 totals)")
            print()
    if failures:
        print("Failures:\n")
        for f in failures:
            print(f"- {f.splitlines()[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
