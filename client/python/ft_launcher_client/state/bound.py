"""state.heal() and Bound (``ctx.state`` of ft_launcher_client.inprocess).

The top of the package: the calls that combine a save's module
(saving.py), a load's (restore.py) and the peer heal's (peerheal.py).
state.heal used to import the heal module at call time because heal
imported state: the peer heal now sits below this module, and nothing
below imports it back.
"""

from . import peerheal
from .restore import load
from .saving import save, wait


def heal(step, state, groups=None, info=None, **kw):
    """Peer heal after an in-process rejoin: ft_launcher_client.heal.heal
    (docs/state.md, "Peer heal")."""
    wait()
    return peerheal.heal(step, state, groups=groups, info=info, **kw)


class Bound:
    """save/load/heal bound to a rank's monitor client (``ctx.state`` of
    ft_launcher_client.inprocess), so saves count as checkpoints.
    last_step_at: a callable returning when the rank last called
    ctx.step() (epoch seconds), for heal's report."""

    def __init__(self, monitor, last_step_at=None):
        self._monitor = monitor
        self._last_step_at = last_step_at

    def heal(self, step, state, groups=None, info=None, **kw):
        """ft_launcher_client.heal.heal (peer heal after an in-process
        rejoin; docs/state.md, "Peer heal")."""
        kw.setdefault("step_at", self._last_step_at)
        wait()
        return peerheal.heal(step, state, groups=groups, info=info, **kw)

    def save(self, step, state, checksum=True, path=None, overlap=False):
        m = self._monitor() if callable(self._monitor) else self._monitor
        return save(step, state, monitor=m, checksum=checksum, path=path, overlap=overlap)

    def wait(self):
        """state.wait(): the overlapped save in flight, committed or refused."""
        return wait()

    def load(self, path=None, verify=True, info=None, into=None, trusted_classes=None):
        return load(path=path, verify=verify, info=info, into=into, trusted_classes=trusted_classes)
