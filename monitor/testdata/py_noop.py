# Without FT_RANK_MONITOR_IPC_SOCKET every call is a no-op.
from ft_launcher_client import RankMonitorClient

c = RankMonitorClient()
c.init_workload_monitoring()
c.send_heartbeat()
c.start_section("step")
c.end_section("step")
c.end_all_sections()
assert c.calculate_and_set_hb_timeouts() is False
c.shutdown_workload_monitoring()
print("noop-ok", flush=True)
