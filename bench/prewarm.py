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

With --inprocess, ft-launcher --restart-mode in-process runs
examples/ddp_train_inprocess.py (cold and --prewarm replacement rank) beside
torchrun and the full restart with --prewarm; a survivor has no start or
imports phase (its process stays), so those columns are the replacement's.
--nodes 2 runs two launchers on 127.0.0.2 and 127.0.0.3 (etcd rendezvous;
torchrun: c10d rendezvous on 127.0.0.1), --nproc ranks each; the crashing
rank is the last one.

usage: bench/prewarm.py [--ft-launcher PATH] [--torchrun CMD] [--reps N]
                        [--nproc N] [--prewarm MODULES] [--kinds K,K...] [--inprocess] [--nodes N]
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
# --inprocess: the full restart with --prewarm beside in-process restarts
# (replacement rank cold, and from a standby).
INPROCESS_KINDS = ["torchrun", "ft-launcher --prewarm", "ft-launcher --restart-mode in-process",
                   "ft-launcher --prewarm --restart-mode in-process"]
COLUMNS = ["launcher", "imports", "process group", "checkpoint", "first step"]


def command(kind, a, nproc, workdir, tag, node=0, port=0):
    crash_rank = nproc * a.nodes - 1 if a.nodes > 1 else 1
    train = ["--ckpt-dir", os.path.join(workdir, tag + ".ckpt"), "--out", os.path.join(workdir, tag + ".json"),
             "--steps", "30", "--crash-at-step", "25", "--crash-rank", str(crash_rank), "--step-sleep", str(a.step_sleep)]
    logs = os.path.join(workdir, tag + f".logs{node}")
    if kind == "torchrun":
        where = ["--standalone"] if a.nodes == 1 else [
            "--nnodes", str(a.nodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", tag]
        return shlex.split(a.torchrun) + where + [
            "--nproc_per_node", str(nproc), "--max_restarts", "1",
            "--monitor_interval", "0.1", "--log_dir", logs, PROBE] + train
    where = ["--standalone"] if a.nodes == 1 else [
        "--nnodes", str(a.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.2:{port}",
        "--rdzv-id", tag, "--local-addr", f"127.0.0.{2 + node}"]
    line = [a.ft_launcher] + where + ["--nproc-per-node", str(nproc), "--max-restarts", "1",
                                      "--monitor-interval", "0.1", "--log-dir", logs]
    # The kind's own flags: "ft-launcher --prewarm --agent-store off".
    for f in kind.split()[1:]:
        line.append(f)
        if f == "--prewarm":
            line.append(a.prewarm)
    return line + [PROBE] + train


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        return s.getsockname()[1]


def once(kind, a, nproc, workdir, tag):
    stamps = os.path.join(workdir, tag + ".stamps")
    os.environ["PROBE_STAMPS"] = stamps
    os.environ["PYTHON_EXEC"] = PYTHON
    os.environ["PROBE_TRAIN"] = "ddp_train_inprocess.py" if "in-process" in kind else "ddp_train.py"
    port = free_port() if a.nodes > 1 else 0
    runs = [Run(command(kind, a, nproc, workdir, tag, node, port), workdir, f"{tag}.{node}") for node in range(a.nodes)]
    try:
        for run in runs:
            rc = run.wait(300)
            if rc != 0:
                raise RuntimeError(f"{kind} exited {rc}:\n{run.tail()}")
    finally:
        for run in runs:
            run.stop()
    lines = read_lines(stamps)
    crash = [int(f[0]) for f in lines if f[1] == "crash"]
    after = {}
    for f in lines:
        # The first stamp of each phase and rank after the crash: torchrun's
        # restart count stays 0 on a node whose ranks did not fail.
        if len(crash) == 1 and f[1] in PHASES and int(f[0]) > crash[0]:
            after.setdefault(f[1], {}).setdefault(f[2], int(f[0]))
    nranks = nproc * a.nodes
    if "in-process" in kind and len(crash) == 1:
        # Survivors stay in their processes: no start or imports of their own.
        for p in ("start", "imports"):
            for r in after.get("step", {}):
                after.setdefault(p, {}).setdefault(r, crash[0])
    if len(crash) != 1 or any(len(after.get(p, {})) != nranks for p in PHASES):
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
    p.add_argument("--inprocess", action="store_true",
                   help="compare in-process restarts: the kinds become " + ",".join(INPROCESS_KINDS))
    p.add_argument("--nodes", type=int, default=1, help="launchers on loopback (127.0.0.2, ...), --nproc ranks each")
    a = p.parse_args()
    kinds = [k.strip() for k in (",".join(INPROCESS_KINDS) if a.inprocess else a.kinds).split(",") if k.strip()]
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
            where = f"{nproc} ranks" if a.nodes == 1 else f"{a.nodes} nodes on loopback, {nproc} ranks each"
            print(f"### Crash -> first training step after restart, examples/ddp_train.py, {where} (s, p50)\n")
            print("| launcher | n | total (min-max) | " + " | ".join(COLUMNS) + " |")
            print("|---|---:|---:|" + "---:|" * len(COLUMNS))
            for k, v in res.items():
                if not v:
                    continue
                tot = [x[-1] / 1e9 for x in v]
                cols = [f"{pct([x[j] / 1e9 for x in v], .5):.2f}" for j in range(len(COLUMNS))]
                print(f"| {k} | {len(v)} | {pct(tot, .5):.2f} ({min(tot):.2f}-{max(tot):.2f}) | " + " | ".join(cols) + " |")
            if res.get("torchrun") and res.get(INPROCESS_KINDS[-1]):
                ratio = pct([x[-1] for x in res["torchrun"]], .5) / pct([x[-1] for x in res[INPROCESS_KINDS[-1]]], .5)
                print(f"\nin-process --prewarm vs torchrun: {ratio:.1f}x faster (p50 totals)")
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
