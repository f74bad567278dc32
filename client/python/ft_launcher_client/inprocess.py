"""In-process restarts under ft-launcher ``--restart-mode in-process``.

After a rank failure the launcher replaces only the failed rank. A surviving
rank that uses this module keeps its process: the collective it was in
fails (the dead peer closed its connections), or the launcher's notice
arrives first; this module then leaves the process group, joins the next
round's (same ``env://`` rendezvous as a fresh rank, against the
launcher's TCPStore under the round's own key prefix), calls the restore
step and runs the training function again. See docs/inprocess.md.

Standard library only; torch is imported when a process group is first
built, never at import.

    from ft_launcher_client.inprocess import InProcess

    def train(ctx):
        model, opt, start = build_and_restore(ctx)   # from the checkpoint
        ddp = DDP(model)
        for step in range(start, steps):
            ...one step...
            ctx.step()          # heartbeat, notice check, first-step report

    InProcess(backend="gloo").run(train)

A rank that does not use this module (or runs under ``--restart-mode
full``) is restarted as before: registering is what opts in.
"""

import json
import logging
import os
import socket
import threading
import time

from . import state as _state
from .client import (
    RankMonitorClient,
    RankMonitorClientError,
    SOCKET_ENV,
    frame,
)

log = logging.getLogger(__name__)

_REJOIN = 0x46
_REPORT = 0x47
_MAX_NOTICE = 1 << 16

# How long a rank whose collective failed waits for the launcher's notice
# before it gives up and re-raises (then it is a failed rank itself).
NOTICE_WAIT_ENV = "FT_INPROCESS_NOTICE_WAIT"
DEFAULT_NOTICE_WAIT = 60.0


class RestartNotice(BaseException):
    """Raised by :meth:`Context.step` (and :meth:`Context.check`) when the
    launcher announced an in-process restart: the training function
    unwinds and :meth:`InProcess.run` rejoins. A BaseException, like
    KeyboardInterrupt, so that a training loop's ``except Exception``
    does not swallow it."""

    def __init__(self, notice):
        super().__init__("in-process restart into round %d" % notice["round"])
        self.notice = notice


class Notice(dict):
    """The launcher's Rejoin notice: round, rank, local_rank, world_size,
    master_addr, master_port, store_prefix, reason, deadline_s."""


def _read_uvarint(sock):
    n, shift = 0, 0
    while True:
        b = sock.recv(1)
        if not b:
            raise EOFError
        n |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            return n
        if shift > 35:
            raise ValueError("length too long")


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _sockets():
    """This process's sockets: {"socket:[inode]": fd} from /proc/self/fd."""
    out = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if link.startswith("socket:"):
            out[link] = int(fd)
    return out


def _shutdown_tcp(opened):
    """shutdown(2) each TCP socket of opened ({"socket:[inode]": fd}) that
    is still the same socket (an fd number can be reused once closed),
    without closing the fd, which stays its owner's: the connection ends
    and the peer reads EOF. Unix sockets (the monitor's) are left alone."""
    for link, fd in opened.items():
        try:
            if os.readlink("/proc/self/fd/%d" % fd) != link:
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                s.getpeername()  # a listener raises here: its owner's accept loop is left alone
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected, or already ended
        finally:
            s.close()  # the duplicate only


class _NoticeReader(threading.Thread):
    """Reads the launcher's notices from one monitor session (the server
    sends nothing else after Config) until the session closes."""

    def __init__(self, sock, deliver):
        super().__init__(name="ft-inprocess-notices", daemon=True)
        self._sock = sock
        self._deliver = deliver

    def run(self):
        try:
            while True:
                t = self._sock.recv(1)
                if not t:
                    return
                n = _read_uvarint(self._sock)
                if n > _MAX_NOTICE:
                    log.warning("in-process: notice of %d bytes refused", n)
                    return
                payload = _recv_exact(self._sock, n)
                if t[0] != _REJOIN:
                    continue  # a later server's message this client does not know
                self._deliver(Notice(json.loads(payload.decode())))
        except (OSError, EOFError, ValueError) as e:
            log.debug("in-process: notice reader ends: %r", e)


class Context:
    """What the training function gets: the round it runs in, whether it
    runs after an in-process restart, the notice, and the per-step hook."""

    def __init__(self, owner):
        self._owner = owner
        self.round = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0")
        self.restarted = False  # True after an in-process restart
        self.attempt = 0  # in-process restarts of this process so far
        self.notice = None
        self.snapshot = owner.snapshot
        # The launcher-held state (docs/state.md); saves count as checkpoints.
        self.state = _state.Bound(lambda: owner.monitor, last_step_at=lambda: owner._last_step_at)

    @property
    def monitor(self):
        """The rank's RankMonitorClient (heartbeats, sections)."""
        return self._owner.monitor

    def check(self):
        """Raise RestartNotice when the launcher announced a restart."""
        n = self._owner._pending()
        if n is not None and n["round"] > self.round:
            raise RestartNotice(n)

    def step(self, check=True):
        """Call once per training step: sends a heartbeat, reports the
        first step after an in-process restart, and raises RestartNotice
        when a restart was announced (with check=False the caller calls
        check() itself, later)."""
        self._owner._step_done()
        if check:
            self.check()


class Snapshot:
    """An in-memory copy of the training state, for a restore that does not
    read the checkpoint file. Take it where the checkpoint is written, so it
    equals the checkpoint a replacement rank loads (docs/inprocess.md)."""

    def __init__(self):
        self._state = None
        self.step = None

    def save(self, step, **state):
        """Keep a deep copy of ``state`` (state_dicts, RNG states...)."""
        import copy

        self._state = copy.deepcopy(state)
        self.step = step

    def load(self, step=None):
        """Return (step, a copy of the state), or (None, None) when empty or,
        with ``step`` given, when the copy holds another step (the ranks'
        copies can differ by one checkpoint: see docs/inprocess.md)."""
        import copy

        if self._state is None or (step is not None and step != self.step):
            return None, None
        return self.step, copy.deepcopy(self._state)

    def __bool__(self):
        return self._state is not None


class InProcess:
    """Run a training function with in-process restarts.

    backend: the process group backend (``gloo``, ``nccl``).
    restore: optional ``restore(ctx)`` called before the training function
    runs again after an in-process restart (timed as the restore phase); the
    training function may as well restore itself, looking at ``ctx``.
    notice_wait: seconds a rank whose collective failed waits for the
    launcher's notice (default $FT_INPROCESS_NOTICE_WAIT or 60).
    """

    def __init__(self, backend="gloo", restore=None, notice_wait=None, timeout=None, monitor=None):
        self.backend = backend
        self.restore = restore
        if notice_wait is None:
            notice_wait = float(os.environ.get(NOTICE_WAIT_ENV, DEFAULT_NOTICE_WAIT))
        self.notice_wait = notice_wait
        if isinstance(timeout, (int, float)):
            import datetime

            timeout = datetime.timedelta(seconds=timeout)
        self.timeout = timeout
        self.monitor = monitor if monitor is not None else RankMonitorClient()
        self.snapshot = Snapshot()
        self._cv = threading.Condition()
        self._notice = None
        self._reader = None
        self._pg_sockets = {}  # TCP sockets the current group's init opened (_teardown)
        self._phases = None  # timings of the restart until its first step
        self._launcher = bool(os.environ.get(SOCKET_ENV))
        self._last_step_at = None  # wall time of the last ctx.step() (peer heal's report)

    # -- monitor session -------------------------------------------------

    def _connect(self):
        self.monitor.inprocess = True
        self.monitor.init_workload_monitoring()
        sock = self.monitor._sock
        if sock is not None:
            self._reader = _NoticeReader(sock, self._deliver)
            self._reader.start()

    def _reconnect(self):
        # Heartbeats from the user's other threads are no-ops meanwhile;
        # section calls belong to the training thread, which is this one.
        self.monitor._rejoining = True
        try:
            self.monitor.shutdown_workload_monitoring()
            if self._reader is not None:
                self._reader.join(timeout=5)
                self._reader = None
            self._connect()
        finally:
            self.monitor._rejoining = False

    def _deliver(self, notice):
        with self._cv:
            if self._notice is None or notice["round"] > self._notice["round"]:
                self._notice = notice
            self._cv.notify_all()

    def _pending(self):
        with self._cv:
            return self._notice

    def _wait_notice(self, after_round, timeout):
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._notice is None or self._notice["round"] <= after_round:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)
            return self._notice

    def _report(self, rnd, phase, **secs):
        sock = self.monitor._sock
        if sock is None:
            return
        body = {"round": rnd, "phase": phase}
        body.update(secs)
        try:
            sock.sendall(frame(_REPORT, json.dumps(body).encode()))
        except OSError as e:
            log.warning("in-process: report %s: %r", phase, e)

    def _step_done(self):
        self._last_step_at = time.time()
        self.monitor.send_heartbeat()
        p = self._phases
        if p is not None:
            self._phases = None
            p["first_step_s"] = time.monotonic() - p.pop("_resumed")
            self._report(p.pop("_round"), "first_step", **p)

    # -- process group ---------------------------------------------------

    def _init_pg(self):
        import torch.distributed as dist

        kw = {}
        if self.timeout is not None:
            kw["timeout"] = self.timeout
        # torch 2.x names the default group from a counter it bumps before
        # the rendezvous, and only destroy_process_group resets it. After a
        # failed first init (a peer died before the group formed) the next
        # init would name its group "1" while the round's fresh ranks use
        # "0": different store keys, and init_process_group waits for peers
        # that never come. Put the counter back when init fails.
        from torch.distributed import distributed_c10d as c10d

        world = getattr(c10d, "_world", None)
        count = getattr(world, "group_count", None)
        before = _sockets()
        try:
            dist.init_process_group(backend=self.backend, init_method="env://", **kw)
        except BaseException:
            if count is not None and not dist.is_initialized():
                world.group_count = count
            raise
        self._pg_sockets = {link: fd for link, fd in _sockets().items() if link not in before}

    def _teardown(self):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as e:  # a broken group may refuse; drop it anyway
                log.warning("in-process: destroy_process_group: %r", e)
        # torch 2.6 keeps the destroyed group alive (references held outside
        # Python's reach), so its gloo connections stay open, and a peer
        # blocked in a collective waiting on this rank would wait for the
        # group's timeout (30 min by default) instead of failing and
        # rejoining: 4-rank in-process restarts failed so. Shut down the TCP
        # connections that init_process_group opened: the peer's collective
        # fails at once. torch 1.13 frees the group here and finds them
        # closed already.
        _shutdown_tcp(self._pg_sockets)
        self._pg_sockets = {}

    @staticmethod
    def _adopt(n):
        # The same environment a fresh rank of the round gets, so that
        # env:// (and user code reading it) sees the new round.
        os.environ.update({
            "RANK": str(n["rank"]),
            "LOCAL_RANK": str(n["local_rank"]),
            "WORLD_SIZE": str(n["world_size"]),
            "MASTER_ADDR": n["master_addr"],
            "MASTER_PORT": str(n["master_port"]),
            "TORCHELASTIC_RESTART_COUNT": str(n["round"]),
        })

    # -- the loop --------------------------------------------------------

    def run(self, train, *args, **kwargs):
        """Call ``train(ctx, *args, **kwargs)`` until it returns; after a
        fault rejoin the next round in process and call it again."""
        if not self._launcher:
            # Not under ft-launcher: no notices will come; behave as plain code.
            self._init_pg()
            return train(Context(self), *args, **kwargs)
        self._connect()
        ctx = Context(self)
        built = False
        while True:
            try:
                if not built:
                    # Inside the try: a peer that dies before the first
                    # group is up fails init_process_group here, and this
                    # rank, registered already, is kept and notified.
                    self._init_pg()
                    built = True
                    if ctx.round > 0:
                        # A fresh rank of a restarted round reports its
                        # first step too: the launcher of a node whose
                        # ranks all started afresh learns from it that the
                        # job's restart is over.
                        self._phases = {"_round": ctx.round, "_resumed": time.monotonic()}
                return train(ctx, *args, **kwargs)
            except RestartNotice as e:
                notice = e.notice
                noticed = time.monotonic()
            except (KeyboardInterrupt, SystemExit):
                raise
            except RuntimeError as e:
                # Most likely the collective failed because a peer died; the
                # launcher's notice follows. If none comes this rank is the
                # failure: re-raise.
                noticed = time.monotonic()
                if not built:  # say it now: a misconfiguration fails here too
                    log.warning("in-process: init_process_group failed: %r; waiting up to %.0f s for the launcher's notice",
                                e, self.notice_wait)
                notice = self._wait_notice(ctx.round, self.notice_wait)
                if notice is None:
                    log.error("in-process: no restart notice within %.0f s after %r; failing", self.notice_wait, e)
                    raise
                log.warning("in-process: %r; rejoining round %d", e, notice["round"])
            ctx = self._rejoin(ctx, notice, noticed)
            built = True

    def _rejoin(self, old, notice, noticed):
        t0 = time.monotonic()
        _wait_state()  # an overlapped save of the old round commits as the old rank
        self._teardown()
        t1 = time.monotonic()
        self._adopt(notice)
        self._reconnect()
        self._init_pg()
        t2 = time.monotonic()
        self._report(notice["round"], "rejoined", teardown_s=t1 - t0, rejoin_s=t2 - t1)
        ctx = Context(self)
        ctx.restarted = True
        ctx.attempt = old.attempt + 1
        ctx.notice = notice
        if self.restore is not None:
            self.restore(ctx)
        t3 = time.monotonic()
        self._phases = {"_round": notice["round"], "_resumed": t3, "teardown_s": t1 - t0,
                        "rejoin_s": t2 - t1, "restore_s": t3 - t2}
        log.info("in-process: rejoined round %d as rank %d of %d (teardown %.3fs, rejoin %.3fs, waited %.3fs)",
                 notice["round"], notice["rank"], notice["world_size"], t1 - t0, t2 - t1, t0 - noticed)
        return ctx

    def close(self):
        """End the monitor session (the process group is the caller's)."""
        _wait_state()
        self.monitor.shutdown_workload_monitoring()
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None


def _wait_state():
    """Let an overlapped state save in flight finish (state.wait()); its
    failure is logged, not raised: the rank goes on without that save."""
    try:
        _state.wait()
    except Exception as e:
        log.warning("in-process: the overlapped state save in flight failed: %r", e)


__all__ = ["InProcess", "Context", "Notice", "RestartNotice", "Snapshot", "RankMonitorClientError"]
