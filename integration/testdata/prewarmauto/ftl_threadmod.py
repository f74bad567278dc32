# A module that starts a thread at import: a --prewarm auto standby must
# leave it out (integration/prewarm_auto_test.go).
import threading
import time


def _tick():
    while True:
        time.sleep(3600)


threading.Thread(target=_tick, name="ftl-threadmod", daemon=True).start()
