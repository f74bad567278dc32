"""A module whose import lasts until released (prewarm tests of a restart
that comes while a standby is still importing).

$FTL_SLOW_MODE: "burn" uses CPU (about half a core) while it waits,
"sleep" uses none. It writes $FTL_SLOW_DIR/importing-<pid> once it has
used 0.2 s of CPU (burn) or at once (sleep), and returns once
$FTL_SLOW_DIR/release exists (at most 120 s).
"""
import os
import time

_dir = os.environ["FTL_SLOW_DIR"]
_burn = os.environ.get("FTL_SLOW_MODE", "burn") == "burn"
_marked = False
_end = time.monotonic() + 120
while not os.path.exists(os.path.join(_dir, "release")) and time.monotonic() < _end:
    if _burn:
        t = time.process_time() + 0.02
        while time.process_time() < t:
            pass
    if not _marked and (not _burn or time.process_time() >= 0.2):
        with open(os.path.join(_dir, "importing-%d" % os.getpid()), "w") as f:
            f.write(str(time.process_time()))
        _marked = True
    time.sleep(0.02)
