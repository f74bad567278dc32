#!/usr/bin/python3
"""Crash -> next training step after the restart, side by side:
torchrun, ft-launcher (cold) and ft-launcher --prewarm.

--kinds prewarm-auto runs --prewarm auto, every run with the same rank
command line and one state file, so that a run starts from what the
earlier ones learned (the first run of a bench from the built-in list);
prewarm-auto-first empties the state file before each run (a job's first
run); prewarm-best runs --prewarm-best MODULES (a hand-written list).

--kinds nvrx adds NVIDIA's ft_launcher (nvidia-resiliency-ext; --nvrx CMD),
started with the same torchrun flags as torchrun.

Every launcher runs examples/ddp_train.py (gloo, CPU) through
bench/workers/ddp_probe.py, which stamps the phases of each rank. Modes:
  late   rank 1 crashes (os._exit(1)) before step 25 of cycle 0 (the step
         sleep leaves the standbys time to import torch first); training
         resumes from the step-20 checkpoint.
  early  rank 1 crashes before its first step at or after --early-at
         seconds (default 3) since the launch: --prewarm's standbys (started
         2 s after the first ranks) are still importing; training restarts
         from step 0 (no checkpoint yet). Besides --prewarm (auto) it runs
         --prewarm-importing wait and stop, the two paths auto chooses from.
  learn  what --prewarm auto learns from a crashing rank: the ranks also
         import --learn-module (default ftl_learn_slow from
         integration/testdata/prewarmauto: 1.5 s of import, named by
         nobody); rank 1 crashes (os._exit(1)) in cycles 0 and 1 at its first
         step at or after --learn-crash-at (default 4) seconds since its
         user code started and --learn-crash-after (default 2) seconds since
         its imports (a loaded machine imports slower); measured: cycle 1's crash -> cycle 2's step,
         whose standbys were started in cycle 1, from what cycle 0's ranks
         reported. Default kinds: auto with the state emptied before each
         run (a first job), --prewarm torch,torch.distributed, the same
         plus the module by hand (prewarm-named), cold. Also the largest
         standby's RSS (sampled when each standby is ready).
  learn-early  the same, but the crashing rank never steps: its first
         optimizer step prepares data (allocates) until then and crashes.
Measured from the crash stamp: per rank, crash -> that rank's first training
step of cycle 1; per run, the last rank's (the job's next step); the time
each rank spent inside init_process_group; for ft-launcher the path each rank
took (--event-log: prewarm_started / prewarm_fallback of round 1: warm,
waited, stopped, cold). Phases as the maximum over ranks of cycle 1's stamps:
launcher (crash -> user code of every rank running), imports (torch,
torch.distributed, torch.nn), process group, checkpoint (torch.load), first
step (DDP construction, forward, backward, optimizer step).

With --inprocess, ft-launcher --restart-mode in-process runs
examples/ddp_train_inprocess.py (cold and --prewarm replacement rank) beside
torchrun and the full restart with --prewarm; a survivor has no start or
imports phase (its process stays), so those columns are the replacement's.
On a GPU: --python names the interpreter that has torch, --train-args
"--device cuda" runs the example on CUDA tensors (gloo; several ranks may
share one GPU) or "--device cuda --backend nccl" (one rank per GPU), and a
"CUDA context" phase is split out of the imports (the example creates the
context before init_process_group). With one rank, rank 0 crashes.
--nodes 2 (late mode) runs two launchers on 127.0.0.2 and 127.0.0.3 (etcd
rendezvous; torchrun: c10d rendezvous on 127.0.0.1), --nproc ranks each; the
crashing rank is the last one.

usage: bench/prewarm.py [--ft-launcher PATH] [--torchrun CMD] [--nvrx CMD] [--reps N]
                        [--nproc N,...] [--mode late,early,learn,learn-early] [--kinds K,...]
                        [--prewarm MODULES] [--inprocess] [--nodes N]
                        [--python PATH] [--train-args ARGS] [--json FILE]
                        [--run-timeout S] [--keep-failed DIR]
                        [--learn-module M] [--learn-path DIR] [--learn-crash-at S] [--learn-crash-after S]
Prints markdown tables on stdout; progress and failures on stderr.
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench import DEFAULT_TORCHRUN, Run, descendants, pct, progress, read_lines  # noqa: E402

PROBE = os.path.join(HERE, "workers", "ddp_probe.py")
PYTHON = "/usr/bin/python3"
PHASES = ["start", "imports", "pg", "ckpt", "step"]
COLUMNS = ["launcher", "imports", "process group", "checkpoint", "first step"]
KINDS = {  # name -> extra ft-launcher flags (None: torchrun's command line, TORCHRUN_LIKE names which)
    "torchrun": None,
    "nvrx ft_launcher": None,
    "torchrun TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": None,
    "ft-launcher": [],
    "ft-launcher --prewarm": ["--prewarm", "{prewarm}"],
    "ft-launcher --prewarm BEST": ["--prewarm", "{best}"],
    "ft-launcher --prewarm +MODULE": ["--prewarm", "{prewarm},{module}"],
    "ft-launcher --prewarm auto": ["--prewarm", "auto"],
    "ft-launcher --prewarm auto, first job": ["--prewarm", "auto"],
    "--prewarm-importing wait": ["--prewarm", "{prewarm}", "--prewarm-importing", "wait"],
    "--prewarm-importing stop": ["--prewarm", "{prewarm}", "--prewarm-importing", "stop"],
    "ft-launcher --agent-store off": ["--agent-store", "off"],
    "ft-launcher --prewarm --agent-store off": ["--prewarm", "{prewarm}", "--agent-store", "off"],
    "ft-launcher --restart-mode in-process": ["--restart-mode", "in-process"],
    "ft-launcher --prewarm --restart-mode in-process": ["--prewarm", "{prewarm}", "--restart-mode", "in-process"],
}
# Launchers that take torchrun's flags, and the option that gives their
# command. torchrun 2.x keeps one TCPStore for every round while its ranks
# no longer prefix their keys per attempt (torch.distributed.rendezvous,
# "We create a new TCPStore for every retry"): after a restart a rank can
# read a dead rank's gloo address (4 and 8 ranks failed so on torch 2.11,
# docs/benchmarks.md); TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is torch's switch
# back to a store per round.
TORCHRUN_LIKE = {"torchrun": "torchrun", "nvrx ft_launcher": "nvrx",
                 "torchrun TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": "torchrun"}
SHORT = {"torchrun": "torchrun", "nvrx": "nvrx ft_launcher",
         "torchrun-unshared": "torchrun TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "cold": "ft-launcher", "prewarm": "ft-launcher --prewarm",
         "prewarm-best": "ft-launcher --prewarm BEST", "prewarm-named": "ft-launcher --prewarm +MODULE", "prewarm-auto": "ft-launcher --prewarm auto",
         "prewarm-auto-first": "ft-launcher --prewarm auto, first job",
         "prewarm-wait": "--prewarm-importing wait", "prewarm-stop": "--prewarm-importing stop",
         "cold-rank0-store": "ft-launcher --agent-store off",
         "prewarm-rank0-store": "ft-launcher --prewarm --agent-store off",
         "inprocess": "ft-launcher --restart-mode in-process",
         "inprocess-prewarm": "ft-launcher --prewarm --restart-mode in-process"}
# --inprocess: the full restart with --prewarm beside in-process restarts
# (replacement rank cold, and from a standby).
INPROCESS_KINDS = "torchrun,prewarm,inprocess,inprocess-prewarm"
DEFAULT_KINDS = {"late": "torchrun,cold,prewarm", "early": "torchrun,cold,prewarm,prewarm-wait,prewarm-stop",
                 "learn": "prewarm-auto-first,prewarm,prewarm-named,cold",
                 "learn-early": "prewarm-auto-first,prewarm,prewarm-named,cold"}
# The modes that crash in cycles 0 and 1 and measure cycle 2 (--mode learn).
LEARN = ("learn", "learn-early")


def crash_rank(a, nproc):
    return nproc * a.nodes - 1 if a.nodes > 1 else min(1, nproc - 1)


def phases(a):
    """Stamped phases and their column names: with --device cuda the CUDA
    context is its own phase, between the imports and the process group. It
    holds the script's own start-up before the context too (on torch 2.x
    torch.use_deterministic_algorithms imports torch._dynamo and
    torch._inductor: about 5 s measured on an H200 host, docs/benchmarks.md)."""
    if "--device cuda" in a.train_args:
        return PHASES[:2] + ["cuda"] + PHASES[2:], COLUMNS[:2] + ["start-up and CUDA context"] + COLUMNS[2:]
    return PHASES, COLUMNS


def rank_tag(kind, mode, nproc, tag):
    """--prewarm auto keeps what it learned per rank command line: its runs
    get the same checkpoint and output paths (emptied before each run), so
    that a run finds what the earlier ones learned."""
    return f"auto-{mode}-{nproc}" if "--prewarm auto" in kind else tag


def command(kind, a, mode, nproc, workdir, tag, node=0, port=0):
    rt = rank_tag(kind, mode, nproc, tag)
    train = shlex.split(a.train_args) + ["--ckpt-dir", os.path.join(workdir, rt + ".ckpt"), "--out", os.path.join(workdir, rt + ".json")]
    if mode in LEARN:
        train += ["--steps", "20", "--step-sleep", "0.2", "--ckpt-every", "0"]
    elif mode == "late":
        train += ["--steps", "30", "--crash-at-step", "25", "--crash-rank", str(crash_rank(a, nproc)),
                  "--step-sleep", str(a.step_sleep)]
    else:
        train += ["--steps", "12", "--step-sleep", "0.2", "--ckpt-every", "0"]
    logs = os.path.join(workdir, tag + f".logs{node}")
    if KINDS[kind] is None:
        where = ["--standalone"] if a.nodes == 1 else [
            "--nnodes", str(a.nodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", tag]
        env = ["env", kind.split()[1]] if "=" in kind else []
        return env + shlex.split(getattr(a, TORCHRUN_LIKE[kind])) + where + [
            "--nproc_per_node", str(nproc), "--max_restarts", "1",
            "--monitor_interval", "0.1", "--log_dir", logs, PROBE] + train
    where = ["--standalone"] if a.nodes == 1 else [
        "--nnodes", str(a.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.2:{port}",
        "--rdzv-id", tag, "--local-addr", f"127.0.0.{2 + node}"]
    line = [a.ft_launcher] + where + ["--nproc-per-node", str(nproc), "--max-restarts", "2" if mode in LEARN else "1",
                                      "--monitor-interval", "0.1", "--log-dir", logs,
                                      "--event-log", os.path.join(workdir, tag + f".events{node}")]
    line += [x.format(prewarm=a.prewarm, best=a.prewarm_best, module=a.learn_module) for x in KINDS[kind]]
    return line + [PROBE] + train


def dump_stacks(runs):
    """SIGABRT every Python process under the launchers: faulthandler
    (PYTHONFAULTHANDLER=1) writes each one's thread stacks to its log."""
    for run in runs:
        for pid in descendants(run.proc.pid):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if "python" in f.read():
                        os.kill(pid, signal.SIGABRT)
            except OSError:
                pass
    time.sleep(2)


def keep(a, workdir, tag):
    """--keep-failed: copy a failed run's logs, events and stamps (not its
    checkpoints) out of the temporary directory."""
    if not a.keep_failed:
        return
    dest = os.path.join(a.keep_failed, tag)
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(workdir):
        if name.startswith(tag + ".") and not name.endswith(".ckpt"):  # checkpoints: MBs, no clue
            src = os.path.join(workdir, name)
            (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(dest, name))
    progress(f"kept the logs of {tag} in {dest}")


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        return s.getsockname()[1]


def paths(events_files, rnd="1"):
    """Round rnd's path per node and local rank from ft-launcher's event logs."""
    out = {}
    for node, events_file in enumerate(events_files):
        try:
            with open(events_file) as f:
                evs = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            continue
        for lr, p in paths_of(evs, rnd).items():
            out[f"{node}:{lr}"] = p
    return out


def paths_of(evs, rnd="1"):
    out = {}
    for e in evs:
        if str(e.get("round")) != rnd:
            continue
        if e.get("event") == "prewarm_started":
            for lr in e["local_ranks"]:
                out.setdefault(int(lr), "warm")
        elif e.get("event") == "prewarm_fallback":
            p = e.get("path", "cold")
            if p == "waited":
                p += f" {e.get('wait_ms', 0) / 1000:.2f}s"
            out[int(e["local_rank"])] = p
    return out


def once(kind, a, mode, nproc, workdir, tag):
    stamps = os.path.join(workdir, tag + ".stamps")
    os.environ["PROBE_STAMPS"] = stamps
    os.environ["PYTHON_EXEC"] = a.python
    os.environ["PYTHONFAULTHANDLER"] = "1"  # stacks on SIGABRT (dump_stacks)
    os.environ["PROBE_TRAIN"] = "ddp_train_inprocess.py" if "in-process" in kind else "ddp_train.py"
    if mode == "early":
        os.environ.update(PROBE_CRASH_AFTER=str(a.early_at), PROBE_CRASH_RANK=str(crash_rank(a, nproc)),
                          PROBE_T0=str(time.time_ns()))
    else:
        for k in ("PROBE_CRASH_AFTER", "PROBE_T0"):
            os.environ.pop(k, None)
    learn = mode in LEARN
    for k in ("PROBE_IMPORT", "PROBE_CRASH_ROUNDS", "PROBE_CRASH_SINCE_START", "PROBE_CRASH_AFTER_IMPORTS", "PROBE_CRASH_BEFORE_STEP", "PYTHONPATH"):
        os.environ.pop(k, None)
    if learn:
        os.environ.update(PROBE_IMPORT=a.learn_module, PROBE_CRASH_ROUNDS="0,1", PROBE_CRASH_RANK=str(crash_rank(a, nproc)),
                          PROBE_CRASH_SINCE_START=str(a.learn_crash_at),
                          PROBE_CRASH_AFTER_IMPORTS=str(a.learn_crash_after), PYTHONPATH=a.learn_path,
                          PROBE_CRASH_BEFORE_STEP="1" if mode == "learn-early" else "0")
    rnd = "2" if learn else "1"  # the cycle measured
    # --prewarm auto: its state file, kept across the reps of this bench
    # (removed before each run of the "first job" kind).
    state = os.path.join(workdir, "state-first" if "first job" in kind else "state")
    os.environ["XDG_STATE_HOME"] = state
    if "first job" in kind:
        shutil.rmtree(state, ignore_errors=True)
    rt = rank_tag(kind, mode, nproc, tag)
    if rt != tag:
        shutil.rmtree(os.path.join(workdir, rt + ".ckpt"), ignore_errors=True)
    port = free_port() if a.nodes > 1 else 0
    runs = [Run(command(kind, a, mode, nproc, workdir, tag, node, port), workdir, f"{tag}.{node}")
            for node in range(a.nodes)]
    failed = True
    sampler = StandbyMemory(os.path.join(workdir, tag + ".events0")) if learn and KINDS[kind] else None
    try:
        deadline = time.monotonic() + a.run_timeout
        for run in runs:
            rc = run.wait(max(1.0, deadline - time.monotonic()))
            if rc is None:
                dump_stacks(runs)
                raise RuntimeError(f"{kind} did not end within {a.run_timeout:.0f} s (Python stacks in the rank logs):\n"
                                   f"{run.tail()}")
            if rc != 0:
                raise RuntimeError(f"{kind} exited {rc}:\n{run.tail()}")
        failed = False
    finally:
        if sampler:
            sampler.stop()
        for run in runs:
            run.stop()
        if failed:
            keep(a, workdir, tag)  # after stop: the logs are complete
    lines = read_lines(stamps)
    # The crash before the measured cycle (learn: cycle 0 crashed too).
    crash = [int(f[0]) for f in lines if f[1] == "crash" and (not learn or f[3] == "1")]
    after = {}
    for f in lines:
        # Cycle 1's stamps; on a node whose ranks did not fail torchrun keeps
        # restart count 0, so there the first stamps after the crash count.
        later = a.nodes > 1 and len(crash) == 1 and int(f[0]) > crash[0]
        if f[3] == rnd or (later and f[3] == "0"):
            after.setdefault(f[1], {}).setdefault(f[2], int(f[0]))
    if not after.get("ckpt"):  # early: no checkpoint to load yet
        after["ckpt"] = after.get("pg", {})
    if "in-process" in kind and len(crash) == 1:
        # Survivors stay in their processes: no start, imports or CUDA
        # context of their own.
        for p in ("start", "imports", "cuda"):
            for r in after.get("step", {}):
                after.setdefault(p, {}).setdefault(r, crash[0])
    names = phases(a)[0]
    need = names + ["pg0"]
    if len(crash) != 1 or any(len(after.get(p, {})) != nproc * a.nodes for p in need):
        raise RuntimeError(f"{kind}: incomplete stamps in {stamps}")
    ends = [max(after[p].values()) - crash[0] for p in names]  # cumulative, ns
    ranks = sorted(after["step"])
    return {
        "phases": [ends[0]] + [ends[i] - ends[i - 1] for i in range(1, len(ends))],
        "total": ends[-1],
        "per_rank": [after["step"][r] - crash[0] for r in ranks],
        "pg": [after["pg"][r] - after["pg0"][r] for r in ranks],
        "paths": paths([os.path.join(workdir, tag + f".events{n}") for n in range(a.nodes)], rnd),
        "crash_s": (crash[0] - runs[0].t0) / 1e9,
        "standby_kib": sampler.largest() if sampler else None,
        "crash0_after_imports_s": crash0_after_imports(lines) if learn else None,
    }


class StandbyMemory:
    """Reads each standby's memory (/proc/PID/status: VmRSS, RssAnon) when
    the event log says it is ready; largest() is the largest RSS seen."""

    def __init__(self, events):
        import threading

        self.events, self.seen, self.kib = events, set(), []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(0.05):
            try:
                with open(self.events) as f:
                    evs = [json.loads(x) for x in f if x.endswith("\n")]
            except (OSError, ValueError):
                continue
            for e in evs:
                pid = e.get("pid")
                if e.get("event") != "prewarm_ready" or pid in self.seen:
                    continue
                self.seen.add(pid)
                try:
                    with open(f"/proc/{pid}/status") as f:
                        st = {k: int(v.split()[0]) for k, _, v in (x.partition(":") for x in f)
                              if k in ("VmRSS", "RssAnon")}
                    self.kib.append((st["VmRSS"], st["RssAnon"]))
                except (OSError, KeyError, ValueError):
                    pass  # already handed a rank, or gone

    def stop(self):
        self.done.set()
        self.thread.join()

    def largest(self):
        return max(self.kib) if self.kib else None


def rss(runs):
    """p50 of the runs' largest standby RSS and its anonymous part, MiB."""
    kib = [r["standby_kib"] for r in runs if r.get("standby_kib")]
    if not kib:
        return "-"
    return f"{pct([k[0] for k in kib], .5) / 1024:.0f} / {pct([k[1] for k in kib], .5) / 1024:.0f}"


def crash0_after_imports(lines):
    """Seconds from the crashing rank's imports stamp to its crash in cycle 0."""
    crash = [f for f in lines if f[1] == "crash" and f[3] == "0"]
    imp = [f for f in lines if crash and f[1] == "imports" and f[2] == crash[0][2] and f[3] == "0"]
    return (int(crash[0][0]) - int(imp[0][0])) / 1e9 if imp else None


def dist3(values):
    """p50 / p90 / worst of values in ns, as seconds."""
    s = [v / 1e9 for v in values]
    return f"{pct(s, .5):.2f} / {pct(s, .9):.2f} / {max(s):.2f}"


def path_counts(runs):
    n = {}
    for r in runs:
        for p in r["paths"].values():
            k = p.split()[0]
            n[k] = n.get(k, 0) + 1
    waits = [float(p.split()[1][:-1]) for r in runs for p in r["paths"].values() if p.startswith("waited")]
    text = ", ".join(f"{k} {v}" for k, v in sorted(n.items())) or "-"
    if waits:
        text += f" (wait p50 {pct(waits, .5):.2f} s, worst {max(waits):.2f} s)"
    return text


def table(a, mode, nproc, res):
    what = {"late": "late crash (standbys ready)", "early": "early crash (standbys importing)",
            "learn": f"crashes in cycles 0 and 1 after the first step, {a.learn_module} named by nobody: cycle 2",
            "learn-early": f"crashes in cycles 0 and 1 before the first step, {a.learn_module} named by nobody: cycle 2"}[mode]
    where = f"{nproc} ranks" if a.nodes == 1 else f"{a.nodes} nodes on loopback, {nproc} ranks each"
    extra = f" `{a.train_args}`" if a.train_args else ""
    print(f"### {what}, examples/ddp_train.py{extra}, {where}\n")
    print("Crash -> next training step, seconds, p50 / p90 / worst: of the job (last rank) per run, and of "
          "every rank of every run; time inside init_process_group per rank.\n")
    rnd = "2" if mode in LEARN else "1"
    mem = mode in LEARN
    if mem:
        c0 = [r["crash0_after_imports_s"] for v in res.values() for r in v if r.get("crash0_after_imports_s") is not None]
        print(f"Cycle 0's crash came {pct(c0, .5):.2f} s (p50; {min(c0, default=float('nan')):.2f}-{max(c0, default=float('nan')):.2f}) "
              "after the crashing rank's imports.\n")
    print("| launcher | runs | crash at (s, p50) | job's next step | each rank's next step "
          f"| in init_process_group | runs with a rank > 0.2 s in it | round-{rnd} paths (ranks) |"
          + (" largest standby RSS / anon MiB (p50) |" if mem else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---|" + ("---:|" if mem else ""))
    for k, v in res.items():
        if not v:
            continue
        slow_pg = sum(1 for r in v if max(r["pg"]) > 0.2e9)
        print(f"| {k} | {len(v)} | {pct([r['crash_s'] for r in v], .5):.2f} | {dist3([r['total'] for r in v])} "
              f"| {dist3([x for r in v for x in r['per_rank']])} | {dist3([x for r in v for x in r['pg']])} "
              f"| {slow_pg} | {path_counts(v) if KINDS[k] is not None else ''} |" + (f" {rss(v)} |" if mem else ""))
    columns = phases(a)[1]
    print("\nPhases (s, p50; each the last rank's end of the phase minus the previous phase's):\n")
    print("| launcher | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for k, v in res.items():
        if v:
            print(f"| {k} | " + " | ".join(f"{pct([r['phases'][j] / 1e9 for r in v], .5):.2f}"
                                         for j in range(len(columns))) + " |")
    p50 = {k: pct([r["total"] for r in v], .5) for k, v in res.items() if v}
    pw = p50.get("ft-launcher --prewarm")
    ip = p50.get("ft-launcher --prewarm --restart-mode in-process")
    for base in TORCHRUN_LIKE:
        if pw and base in p50:
            print(f"\n--prewarm vs {base}: {p50[base] / pw:.1f}x faster (p50 of the job's next step)")
        if ip and base in p50:
            print(f"\nin-process (--prewarm replacement) vs {base}: {p50[base] / ip:.1f}x faster (p50 of the job's next step)")
    if "ft-launcher" in p50 and "ft-launcher --agent-store off" in p50:
        print(f"\nagent store / rank-0 store (--agent-store off): {p50['ft-launcher'] / p50['ft-launcher --agent-store off']:.2f}"
              " (ratio of the p50s of the job's next step; at most 1.00 means no slower)")
    au = p50.get("ft-launcher --prewarm auto") or p50.get("ft-launcher --prewarm auto, first job")
    for k in ("ft-launcher --prewarm +MODULE", "ft-launcher --prewarm"):
        if mode in LEARN and au and k in p50:
            print(f"\n--prewarm auto (first job) - {k}: {(au - p50[k]) / 1e9:+.2f} s (difference of the p50s of the job's next step)")
    for k in ("ft-launcher --prewarm BEST", "ft-launcher --prewarm", "ft-launcher --prewarm auto, first job", "ft-launcher"):
        if au and k in p50:
            print(f"\n--prewarm auto / {k}: {au / p50[k]:.2f} (ratio of the p50s of the job's next step"
                  + ("; early-crash target: at most 1.10)" if mode == "early" and k == "ft-launcher" else ")"))
    for k in ("ft-launcher", "--prewarm-importing wait", "--prewarm-importing stop"):
        if pw and k in p50:
            print(f"\n--prewarm / {k}: {pw / p50[k]:.2f} (ratio of the p50s of the job's next step"
                  + ("; early-crash target: at most 1.10)" if mode == "early" and k == "ft-launcher" else ")"))
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    p.add_argument("--torchrun", default=os.environ.get("TORCHRUN", DEFAULT_TORCHRUN))
    p.add_argument("--nvrx", default=os.environ.get("NVRX", "ft_launcher"),
                   help="nvidia-resiliency-ext's launcher command, for --kinds nvrx (takes torchrun's flags)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--nproc", default="2,4", help="comma-separated rank counts")
    p.add_argument("--mode", default="late", help="comma-separated: late, early")
    p.add_argument("--kinds", help="comma-separated, of " + ", ".join(SHORT) + " (default: per mode, "
                   + "; ".join(f"{m}: {k}" for m, k in DEFAULT_KINDS.items()) + ")")
    p.add_argument("--prewarm", default="torch,torch.distributed")
    p.add_argument("--prewarm-best", default="torch,torch.distributed,torch._decomp,torch._dynamo,torch._functorch,"
                   "torch._higher_order_ops,torch._inductor,torch._numpy,torch.compiler,torch.cuda,torch.fx,torch.nn,"
                   "torch.onnx,torch.testing,torch.utils",
                   help="the hand-written list of --kinds prewarm-best (default: the one measured best on torch 2.11, docs/prewarm.md)")
    p.add_argument("--step-sleep", type=float, default=0.5, help="late mode's step sleep")
    p.add_argument("--early-at", type=float, default=3.0, help="early mode: crash this many seconds after the launch")
    p.add_argument("--learn-module", default="ftl_learn_slow", help="learn modes: the module the ranks import that nobody names")
    p.add_argument("--learn-path", default=os.path.join(os.path.dirname(HERE), "integration", "testdata", "prewarmauto"),
                   help="learn modes: the ranks' PYTHONPATH (where --learn-module is)")
    p.add_argument("--learn-crash-at", type=float, default=4.0,
                   help="learn modes: crash this many seconds after the crashing rank's code started (cycles 0 and 1)")
    p.add_argument("--learn-crash-after", type=float, default=2.0,
                   help="learn modes: and at least this many seconds after its imports")
    p.add_argument("--inprocess", action="store_true",
                   help="compare in-process restarts: the kinds become " + INPROCESS_KINDS)
    p.add_argument("--nodes", type=int, default=1, help="launchers on loopback (127.0.0.2, ...), --nproc ranks each")
    p.add_argument("--python", default=PYTHON, help="the ranks' interpreter (PYTHON_EXEC)")
    p.add_argument("--train-args", default="", help='more arguments for the example, e.g. "--device cuda"')
    p.add_argument("--json", help="also write every run's measurements to this file")
    p.add_argument("--run-timeout", type=float, default=300, help="seconds one run may take")
    p.add_argument("--keep-failed", help="copy the logs of failed runs into this directory")
    a = p.parse_args()
    if a.inprocess:
        a.kinds = a.kinds or INPROCESS_KINDS
    if a.nodes < 1 or (a.nodes > 1 and a.mode != "late"):
        p.error("--nodes: 1 or more, and more than 1 only with --mode late")
    modes = a.mode.split(",")
    for m in modes:
        if m not in DEFAULT_KINDS:
            p.error(f"--mode {m}: want one of {', '.join(DEFAULT_KINDS)}")
    for k in (a.kinds or "").split(","):
        if k and k not in SHORT:
            p.error(f"--kinds {k}: want one of {', '.join(SHORT)}")
    print(f"Host: {os.cpu_count()} CPUs, `{os.uname().release}`; reps={a.reps}; "
          f"date {time.strftime('%Y-%m-%d %H:%M:%S')}; load average {os.getloadavg()[0]:.1f} at the start\n")
    failures = []
    everything = []
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="ftbench-prewarm.") as workdir:
        for mode in modes:
            kinds = [SHORT[k] for k in (a.kinds or DEFAULT_KINDS[mode]).split(",")]
            for nproc in [int(n) for n in a.nproc.split(",")]:
                res = {k: [] for k in kinds}
                try:
                    for i in range(a.reps):
                        for k in kinds:
                            tag = f"{mode}-{k.replace(' ', '').replace('-', '')}-{nproc}-{i}"
                            try:
                                res[k].append(once(k, a, mode, nproc, workdir, tag))
                            except Exception as e:  # report, keep measuring
                                failures.append(f"{tag}: {e}")
                                progress(f"FAILED {tag}: {e}")
                        progress(f"{mode}, nproc {nproc}: rep {i + 1}/{a.reps} done, "
                                 f"load average {os.getloadavg()[0]:.1f}")
                except KeyboardInterrupt:  # a time limit: keep what was measured
                    failures.append(f"{mode}, nproc {nproc}: interrupted; the table holds the runs done")
                    interrupted = True
                table(a, mode, nproc, res)
                everything.append({"mode": mode, "nproc": nproc, "train_args": a.train_args, "runs": res})
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump(everything, f)
                if interrupted:
                    break
            if interrupted:
                break
        print(f"Load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    if failures:
        print("Failures:\n")
        for f in failures:
            print(f"- {f.splitlines()[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
