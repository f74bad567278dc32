"""Rank-side client for ft-launcher's rank monitor.

Drop-in for nvidia_resiliency_ext's RankMonitorClient: replace
``from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient`` with
``from ft_launcher_client import RankMonitorClient``. Standard library only.

``FaultToleranceCallback`` (PyTorch Lightning, nvrx's PTL callback) lives in
``ft_launcher_client.lightning``, imported only when asked for, so that this
package never imports Lightning by itself.
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
    "FaultToleranceCallback",
]


def __getattr__(name):
    # Lazy: importing the callback imports Lightning when it is installed.
    if name == "FaultToleranceCallback":
        from .lightning import FaultToleranceCallback

        return FaultToleranceCallback
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
