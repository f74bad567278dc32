"""Rank-side client for ft-launcher's rank monitor.

Drop-in for nvidia_resiliency_ext's RankMonitorClient: replace
``from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient`` with
``from ft_launcher_client import RankMonitorClient``. Standard library only.
"""

from .client import (
    RankMonitorClient,
    RankMonitorClientError,
    WorkloadAction,
    request_workload_action,
    write_finished_flag,
)

__all__ = [
    "RankMonitorClient",
    "RankMonitorClientError",
    "WorkloadAction",
    "request_workload_action",
    "write_finished_flag",
]
