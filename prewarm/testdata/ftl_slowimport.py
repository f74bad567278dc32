"""A module whose import lasts (prewarm tests of a restart that comes
while a standby is still importing).

$FTL_SLOW_MODE: "burn" uses CPU (at most half a core: 20 ms on, 20 ms
off) while it lasts, "sleep" uses none. It writes
$FTL_SLOW_DIR/importing-<pid> once it has used 0.2 s of CPU itself (burn)
or at once (sleep), and returns once $FTL_SLOW_DIR/release exists, once
it has used $FTL_SLOW_CPU seconds of CPU itself when that is set, or
after 120 s.
"""
import os
import time

_dir = os.environ["FTL_SLOW_DIR"]
_burn = os.environ.get("FTL_SLOW_MODE", "burn") == "burn"
_t0 = time.process_time()  # the imports before this one used CPU too
_cpu = _t0 + float(os.environ.get("FTL_SLOW_CPU", "inf"))
_marked = False
_end = time.monotonic() + 120
while (not os.path.exists(os.path.join(_dir, "release")) and time.process_time() < _cpu
       and time.monotonic() < _end):
    if _burn:
        t = time.process_time() + 0.02
        while time.process_time() < t:
            pass
    if not _marked and (not _burn or time.process_time() >= _t0 + 0.2):
        with open(os.path.join(_dir, "importing-%d" % os.getpid()), "w") as f:
            f.write(str(time.process_time()))
        _marked = True
    time.sleep(0.02)
