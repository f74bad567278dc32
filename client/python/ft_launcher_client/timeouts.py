"""The client's own timeouts calculator (RankMonitorClient's
calculate_and_set_hb_timeouts and calculate_and_set_section_timeouts):
nvrx's TimeoutsCalc, kept per rank.
"""

import time


class TimeoutsCalc:
    """Local version of nvrx's TimeoutsCalc: observed maxima of this rank
    (no all_reduce; the launcher also computes node-wide values itself)."""

    def __init__(self, sections, safety_factor):
        self.sections = set(sections)
        self.safety_factor = safety_factor
        self.start = time.monotonic()
        self.last_hb = None
        self.initial_max = 0.0
        self.subsequent_max = 0.0
        self.section_start = {}
        self.section_max = {}
        self.oos_start = self.start
        self.oos_max = 0.0

    def heartbeat(self):
        now = time.monotonic()
        if self.last_hb is None:
            self.initial_max = max(self.initial_max, now - self.start)
        else:
            self.subsequent_max = max(self.subsequent_max, now - self.last_hb)
        self.last_hb = now

    def open(self, name):
        now = time.monotonic()
        if not self.section_start and self.oos_start is not None:
            self.oos_max = max(self.oos_max, now - self.oos_start)
            self.oos_start = None
        self.section_start[name] = now

    def close(self, name):
        now = time.monotonic()
        start = self.section_start.pop(name, None)
        if start is None:
            return
        self.section_max[name] = max(self.section_max.get(name, 0.0), now - start)
        if not self.section_start:
            self.oos_start = now

    def close_all(self):
        for name in list(self.section_start):
            self.close(name)

    def hb_ready(self):
        return self.initial_max > 0 and self.subsequent_max > 0

    def current_oos(self):
        if self.oos_start is None:
            return self.oos_max
        return max(self.oos_max, time.monotonic() - self.oos_start)
