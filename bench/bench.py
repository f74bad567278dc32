#!/usr/bin/python3
"""Side-by-side benchmarks of ft-launcher and torchrun on the same scenarios.

Scenarios (each run for every available launcher, interleaved rep by rep so
that background load hits both alike):
  restart  crash of rank 0 in cycle 0 -> every rank of the node running again
           (max over ranks of the cycle-1 start stamps minus the crash stamp)
  startup  launcher fork/exec -> first and last rank's first line, and -> exit
  rss      VmRSS of the launcher (torchrun: its agent python process) while it
           supervises N sleeping ranks; also the launcher's helper processes
Workers are /bin/sh scripts in bench/workers run with --no-python, so no
interpreter import is measured on the worker side; the launcher's own start
cost (torchrun's Python + torch import) is measured only by `startup`.

usage: bench.py [--ft-launcher PATH] [--torchrun CMD] [--reps N] [--nproc N]
                [--rss-nproc N] [--only restart,startup,rss]
Prints markdown tables on stdout; progress and failures on stderr.
"""
import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
DEFAULT_TORCHRUN = "/usr/bin/python3 /work/shared/bench/torchrun-py311.py"


class Launcher:
    """How to spell one launch line for one launcher."""

    def __init__(self, name, argv, dashes):
        self.name, self.argv, self.dashes = name, argv, dashes

    def flag(self, name):
        return "--" + (name.replace("_", "-") if self.dashes else name.replace("-", "_"))

    def cmd(self, nproc, max_restarts, script, args, log_dir):
        return self.argv + [
            "--standalone",
            self.flag("log_dir"), log_dir,
            self.flag("nproc_per_node"), str(nproc),
            self.flag("max_restarts"), str(max_restarts),
            self.flag("monitor_interval"), "0.1",
            self.flag("no_python"),
            script, *args,
        ]


def progress(msg):
    print(msg, file=sys.stderr, flush=True)


def child_pids(pid):
    """Children of every thread of pid: a Go launcher forks from whichever
    thread runs, and /proc/PID/task/TID/children lists only TID's."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        for c in child_pids(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class Run:
    """One launcher process in its own session, with guaranteed cleanup."""

    def __init__(self, cmd, workdir, tag):
        self.log_path = os.path.join(workdir, f"{tag}.log")
        self.log = open(self.log_path, "wb")
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        # t0 is taken in the child just before exec of the launcher, so the
        # harness's own fork (slow here: start_new_session rules out vfork)
        # is not charged to either launcher.
        t0_path = self.log_path + ".t0"

        def stamp_exec():
            fd = os.open(t0_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, str(time.time_ns()).encode())
            os.close(fd)

        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                     preexec_fn=stamp_exec)
        with open(t0_path) as f:
            self.t0 = int(f.read())
        self.extra_pids = set()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace=15.0):
        """SIGTERM the launcher, then SIGKILL it, its group and any known worker."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait(grace) is None:
                self.proc.kill()
                self.proc.wait()
        for sig_target in [self.proc.pid]:
            try:
                os.killpg(sig_target, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.extra_pids:
            if comm(pid) not in ("sh", "sleep"):
                continue  # gone, or the pid was reused by something else
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()

    def tail(self, n=15):
        with open(self.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")


def read_lines(path):
    try:
        with open(path) as f:
            return [line.split() for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def pct(values, q):
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(ns):
    return ns / 1e6


# ---------------------------------------------------------------- scenarios

def restart_once(launcher, nproc, workdir, tag):
    log = os.path.join(workdir, f"{tag}.stamps")
    cmd = launcher.cmd(nproc, 1, os.path.join(WORKERS, "restart_worker.sh"), [log, "1"],
                       os.path.join(workdir, f"{tag}.logs"))
    run = Run(cmd, workdir, tag)
    try:
        rc = run.wait(120)
        if rc != 0:
            raise RuntimeError(f"{launcher.name} exited {rc}:\n{run.tail()}")
    finally:
        run.extra_pids |= {int(f[4]) for f in read_lines(log) if f[1] == "start"}
        run.stop()
    crash, starts = None, {}
    for f in read_lines(log):
        if f[1] == "crash":
            crash = int(f[0])
        elif f[1] == "start" and f[3] == "1":
            starts[int(f[2])] = int(f[0])
    if crash is None or len(starts) != nproc:
        raise RuntimeError(f"{launcher.name}: incomplete stamps in {log}")
    return max(starts.values()) - crash


def stamp_worker(workdir):
    """The start-latency probe: bench/workers/stamp.c built static when a C
    compiler is there (it stamps right after exec), else stamp_worker.sh
    (a shell and date(1): about 2.5 ms later). Same worker for every launcher."""
    exe = os.path.join(workdir, "stamp")
    if not os.path.exists(exe):
        try:
            subprocess.run(["cc", "-static", "-O2", "-o", exe, os.path.join(WORKERS, "stamp.c")],
                           check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"note: static stamp probe not built ({e}); using stamp_worker.sh", file=sys.stderr)
            return os.path.join(WORKERS, "stamp_worker.sh")
    return exe


def startup_once(launcher, nproc, workdir, tag):
    log = os.path.join(workdir, f"{tag}.stamps")
    cmd = launcher.cmd(nproc, 0, stamp_worker(workdir), [log],
                       os.path.join(workdir, f"{tag}.logs"))
    run = Run(cmd, workdir, tag)
    try:
        rc = run.wait(120)
        t_exit = time.time_ns()
        if rc != 0:
            raise RuntimeError(f"{launcher.name} exited {rc}:\n{run.tail()}")
    finally:
        run.stop()
    stamps = [int(f[0]) for f in read_lines(log)]
    if len(stamps) != nproc:
        raise RuntimeError(f"{launcher.name}: {len(stamps)} of {nproc} ranks stamped")
    return min(stamps) - run.t0, max(stamps) - run.t0, t_exit - run.t0


def rss_once(launcher, nproc, workdir, tag, settle=2.0):
    log = os.path.join(workdir, f"{tag}.pids")
    cmd = launcher.cmd(nproc, 0, os.path.join(WORKERS, "sleep_worker.sh"), [log],
                       os.path.join(workdir, f"{tag}.logs"))
    run = Run(cmd, workdir, tag)
    try:
        deadline = time.monotonic() + 120
        while len(read_lines(log)) < nproc:
            if run.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{launcher.name}: ranks did not start:\n{run.tail()}")
            time.sleep(0.05)
        workers = {int(f[0]) for f in read_lines(log)}
        run.extra_pids |= workers
        time.sleep(settle)  # let the supervision loop reach steady state
        own = rss_kib(run.proc.pid)
        helpers = [p for p in descendants(run.proc.pid) if p not in workers
                   and not any(p in descendants(w) for w in workers)]
        helper_rss = sum(rss_kib(p) for p in helpers)
        helper_names = sorted({comm(p) for p in helpers})
        return own, own + helper_rss, len(helpers), helper_names
    finally:
        run.stop()


# ---------------------------------------------------------------- driver

def main():
    p = argparse.ArgumentParser(description="ft-launcher vs torchrun benchmarks")
    p.add_argument("--ft-launcher", default=os.environ.get("FT_LAUNCHER", "/tmp/ft-launcher"))
    p.add_argument("--torchrun", default=os.environ.get("TORCHRUN", DEFAULT_TORCHRUN),
                   help="torchrun command line (split like a shell would)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--rss-nproc", type=int, default=8)
    p.add_argument("--only", default="restart,startup,rss")
    a = p.parse_args()

    launchers = []
    if a.ft_launcher and os.access(a.ft_launcher, os.X_OK):
        launchers.append(Launcher("ft-launcher", [a.ft_launcher], dashes=True))
    else:
        progress(f"ft-launcher not found at {a.ft_launcher!r}: measuring torchrun only")
    if a.torchrun:
        launchers.append(Launcher("torchrun", shlex.split(a.torchrun), dashes=False))
    only = set(a.only.split(","))

    print(f"Host: {os.cpu_count()} CPUs, `{os.uname().release}`; reps={a.reps}; "
          f"date {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    with tempfile.TemporaryDirectory(prefix="ftbench.") as workdir:
        failures = []

        def collect(scenario, fn, *args):
            res = {l.name: [] for l in launchers}
            for i in range(a.reps):
                for l in launchers:
                    tag = f"{scenario}-{l.name}-{i}"
                    try:
                        res[l.name].append(fn(l, *args, workdir, tag))
                    except Exception as e:  # report, keep measuring the rest
                        failures.append(f"{tag}: {e}")
                        progress(f"FAILED {tag}: {e}")
                progress(f"{scenario}: rep {i + 1}/{a.reps} done")
            return res

        if "restart" in only:
            res = collect("restart", restart_once, a.nproc)
            print(f"### Restart latency: rank crash -> all {a.nproc} ranks running again (ms)\n")
            print("| launcher | n | p50 | max | min |\n|---|---:|---:|---:|---:|")
            for name, v in res.items():
                v = [ms(x) for x in v]
                if v:
                    print(f"| {name} | {len(v)} | {pct(v, .5):.1f} | {max(v):.1f} | {min(v):.1f} |")
            print()

        if "startup" in only:
            res = collect("startup", startup_once, a.nproc)
            print(f"### Launcher exec -> rank exec, {a.nproc} ranks (ms, p50 / max)\n")
            print("| launcher | n | first rank | last rank | launcher exit |\n|---|---:|---:|---:|---:|")
            for name, v in res.items():
                if v:
                    cols = []
                    for j in range(3):
                        c = [ms(x[j]) for x in v]
                        cols.append(f"{pct(c, .5):.1f} / {max(c):.1f}")
                    print(f"| {name} | {len(v)} | " + " | ".join(cols) + " |")
            print()

        if "rss" in only:
            reps, a.reps = a.reps, min(a.reps, 3)
            res = collect("rss", rss_once, a.rss_nproc)
            a.reps = reps
            print(f"### Launcher memory while supervising {a.rss_nproc} sleeping ranks (MiB, p50)\n")
            print("| launcher | n | launcher VmRSS | incl. helper processes | helper processes |\n"
                  "|---|---:|---:|---:|---|")
            for name, v in res.items():
                if v:
                    own = pct([x[0] / 1024 for x in v], .5)
                    tot = pct([x[1] / 1024 for x in v], .5)
                    names = ", ".join(v[-1][3]) or "none"
                    print(f"| {name} | {len(v)} | {own:.1f} | {tot:.1f} | {v[-1][2]} ({names}) |")
            print()

        if failures:
            print("Failures:\n")
            for f in failures:
                print(f"- {f.splitlines()[0]}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
