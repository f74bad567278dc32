# A module nobody names that takes 1.5 s to import: --prewarm auto must
# learn it from a rank that crashes without atexit
# (integration/prewarm_learn_test.go, bench/prewarm.py --mode learn). It
# appends "<pid> standby|rank" to $OUT/slow-imports when $OUT is set: a
# standby runs as python -c.
import os
import sys
import time

time.sleep(1.5)
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "slow-imports"), "a") as f:
        f.write("%d %s\n" % (os.getpid(), "standby" if sys.argv[:1] == ["-c"] else "rank"))
