# Exercises ft_launcher_client against a live monitor (driven by python_test.go).
import os
import sys
import time

from ft_launcher_client import RankMonitorClient, request_workload_action, write_finished_flag

c = RankMonitorClient()
c.init_workload_monitoring()
assert c.cfg.safety_factor == 5.0, c.cfg
assert c.shared_memory_heartbeats, "monitor did not grant shared-memory heartbeats"
for _ in range(4):
    c.send_heartbeat()
    time.sleep(0.01)
assert c.section_ring, "monitor did not grant the section ring"
c.start_section("step")
c.end_section("step")
# More events than the ring holds (wrap-around, waits while it is full).
for i in range(2500):
    c.start_section("step", iteration=i)
    c.end_section("step")
c.start_section("a")
c.start_section("step", iteration=2500)
c.end_all_sections()
# The fifth heartbeat comes a second after the fourth, so the calculated
# heartbeat timeout (safety factor 5 x the longest gap) is about 5 s, counted
# from this heartbeat. With 10 ms gaps only, it was 50 ms: the monitor rightly
# killed this rank as hung while the test was still reading its state.
time.sleep(1.0)
c.send_heartbeat()
assert c.calculate_and_set_hb_timeouts()
assert c.hb_timeouts.subsequent >= 5.0, c.hb_timeouts
sd = c.state_dict()
assert sd["current_timeouts"]["heartbeat"]["were_calculated"], sd
request_workload_action("ShutdownWorkload", "done training")
print(write_finished_flag(), flush=True)
print("done", flush=True)
time.sleep(30)
