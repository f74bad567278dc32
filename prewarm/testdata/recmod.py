"""Records what a rank can observe of how it was started (prewarm tests).

Writes JSON to $RECORD_OUT: argv, path[0], __name__, __file__, the
environment, process group, signal dispositions, stdio targets and more.
"""
import json
import os
import signal
import sys


def target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        return repr(e)


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split()[1]
    return None


sigs = {}
for s in signal.valid_signals():
    try:
        h = signal.getsignal(s)
    except (OSError, ValueError):
        continue
    sigs[int(s)] = h if isinstance(h, int) else getattr(h, "__name__", repr(h))

rec = {
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "path0": sys.path[0],
    "path": sys.path,
    "name": __name__,
    "file": __file__,
    "main_keys": sorted(k for k in globals() if k.startswith("__")),
    "loader": type(__loader__).__name__,
    "spec": repr(__spec__),
    "package": repr(__package__),
    "env": dict(os.environ),
    "cwd": os.getcwd(),
    "pgid_is_pid": os.getpgid(0) == os.getpid(),
    "sid_is_parents": os.getsid(0) == os.getsid(os.getppid()),
    "signals": sigs,
    "sig_ign": status("SigIgn"),
    "sig_blk": status("SigBlk"),
    "stdout": target(1),
    "stderr": target(2),
    "stdin": target(0),
    "stdout_io": [sys.stdout.encoding, sys.stdout.errors, sys.stdout.line_buffering,
                  sys.stdout.write_through, sys.stdout.seekable(), sys.stdout.mode, sys.stdout.buffer.name],
    "stderr_io": [sys.stderr.encoding, sys.stderr.errors, sys.stderr.line_buffering,
                  sys.stderr.write_through, sys.stderr.seekable(), sys.stderr.buffer.name],
    "same_std": sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__,
    "flags": str(sys.flags),
    "fds": sorted(os.listdir("/proc/self/fd")),
    "threads": len(os.listdir("/proc/self/task")),
    # The main thread's nice value: a warm rank must run at a cold one's
    # priority (the standby imported at nice 19).
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
}
print("hello on stdout")
print("hello on stderr", file=sys.stderr)
with open(os.environ["RECORD_OUT"], "w") as f:
    json.dump(rec, f, indent=1, sort_keys=True)
if os.environ.get("RECORD_RAISE"):
    raise ValueError("raised on purpose")
sys.exit(int(os.environ.get("RECORD_EXIT", "0")))
