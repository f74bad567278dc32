#!/usr/bin/python3
"""Runs examples/ddp_train.py unchanged, stamping its phases (bench/prewarm.py).

$PROBE_TRAIN names another training script (bench/prewarm.py --inprocess
runs examples/ddp_train_inprocess.py). A survivor of an in-process restart
stays in its process: its rank and cycle are read at each stamp and the
pg/ckpt/step stamps are written once per cycle.

Appends "<ns> <phase> <rank> <cycle>" lines to $PROBE_STAMPS: start (first
line of user code), imports (torch, torch.distributed, torch.nn done),
cuda (with --device cuda: the CUDA context exists, at the example's
torch.cuda.synchronize), pg0 (init_process_group called), pg
(init_process_group returned), ckpt (torch.load returned), step (the first
optimizer step returned; on a GPU after its kernels finished), crash (right
before an injected os._exit with a non-zero code; the examples end with
os._exit(0), which is not a crash).

$PROBE_CRASH_AFTER (seconds) with $PROBE_T0 (ns, the launch): rank
$PROBE_CRASH_RANK of cycle 0 crashes (os._exit(1)) before its first
optimizer step at or after that many seconds since the launch (the
early-crash mode of bench/prewarm.py).

$PROBE_IMPORT (comma-separated) names more modules to import with torch,
before the imports stamp (bench/prewarm.py --mode learn: one that nobody
names). $PROBE_CRASH_ROUNDS (comma-separated cycles) with
$PROBE_CRASH_SINCE_START and $PROBE_CRASH_AFTER_IMPORTS (seconds): rank
$PROBE_CRASH_RANK of those cycles crashes (os._exit(1)) at its first
optimizer step at or after both that many seconds since its user code
started and since its imports stamp; with $PROBE_CRASH_BEFORE_STEP=1 its
first optimizer step instead prepares data (allocates lists, 5000 every
10 ms, as a data pipeline would) until then and crashes, so it never steps.
"""
import os
import runpy
import sys
import time

T0 = time.time_ns()
_FD = os.open(os.environ["PROBE_STAMPS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def stamp(phase, at=None):
    rank, cycle = os.environ.get("RANK", "?"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    os.write(_FD, f"{at or time.time_ns()} {phase} {rank} {cycle}\n".encode())


stamp("start", T0)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn  # noqa: E402,F401
from torch.nn.parallel import DistributedDataParallel  # noqa: E402,F401

for _m in filter(None, os.environ.get("PROBE_IMPORT", "").split(",")):
    __import__(_m)
IMPORTED = time.time_ns()
stamp("imports", IMPORTED)


_sync = torch.cuda.synchronize


def after(obj, name, phase, once=True, before=None, sync=False):
    """Wrap obj.name to stamp phase when it returns (once per cycle), and
    before when it is called; sync: wait for the GPU's kernels first."""
    orig = getattr(obj, name)
    done = set()  # cycles stamped

    def wrapped(*a, **k):
        if before and not (once and os.environ.get("TORCHELASTIC_RESTART_COUNT") in done):
            stamp(before)
        r = orig(*a, **k)
        if sync and torch.cuda.is_initialized():
            _sync()  # the call is done when its kernels are
        cycle = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if not (once and cycle in done):
            done.add(cycle)
            stamp(phase)
        return r
    setattr(obj, name, wrapped)


after(dist, "init_process_group", "pg", before="pg0")
after(torch, "load", "ckpt")
after(torch.optim.Adam, "step", "step", sync=True)
after(torch.cuda, "synchronize", "cuda")
_exit = os._exit


def crash(code):
    if code:
        stamp("crash")
    _exit(code)


os._exit = crash

_CRASH_AFTER = os.environ.get("PROBE_CRASH_AFTER")
if (_CRASH_AFTER and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
        and os.environ.get("RANK") == os.environ.get("PROBE_CRASH_RANK", "1")):
    _crash_at = int(os.environ["PROBE_T0"]) + int(float(_CRASH_AFTER) * 1e9)
    _step = torch.optim.Adam.step

    def _step_or_crash(*a, **k):
        if time.time_ns() >= _crash_at:
            crash(1)
        return _step(*a, **k)
    torch.optim.Adam.step = _step_or_crash
_ROUNDS = os.environ.get("PROBE_CRASH_ROUNDS")
if (_ROUNDS and os.environ.get("TORCHELASTIC_RESTART_COUNT") in _ROUNDS.split(",")
        and os.environ.get("RANK") == os.environ.get("PROBE_CRASH_RANK", "1")):
    _crash_at = max(T0 + int(float(os.environ.get("PROBE_CRASH_SINCE_START", "0")) * 1e9),
                    IMPORTED + int(float(os.environ.get("PROBE_CRASH_AFTER_IMPORTS", "0")) * 1e9))
    _step = torch.optim.Adam.step

    def _step_or_crash(*a, **k):
        if os.environ.get("PROBE_CRASH_BEFORE_STEP") == "1":
            while time.time_ns() < _crash_at:
                _data = [[i] for i in range(5000)]  # noqa: F841
                time.sleep(0.01)
        if time.time_ns() >= _crash_at:
            crash(1)
        return _step(*a, **k)
    torch.optim.Adam.step = _step_or_crash
train = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                     os.environ.get("PROBE_TRAIN", "ddp_train.py"))
train = os.path.normpath(train)
sys.argv = [train] + sys.argv[1:]
runpy.run_path(train, run_name="__main__")
