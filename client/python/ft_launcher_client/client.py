"""RankMonitorClient speaking ft-launcher's native FTL1 protocol (docs/protocol.md).

A heartbeat is two stores into a shared-memory region the monitor passes at
the handshake (no syscall), and a section open/close is five stores into a
ring in that region; without the region each is a few bytes written to a
Unix socket with no reply.
"""

import array
import enum
import json
import logging
import mmap
import os
import select
import socket
import threading
import time
import types

from .timeouts import TimeoutsCalc

_MAGIC = b"FTL1"
_HEARTBEAT = b"\x01"
_SECTION_OPEN = 0x02
_SECTION_CLOSE = 0x03
_SECTION_CLOSE_ALL = b"\x04"
_SECTION_OPEN_ITER = 0x05
_HELLO = 0x40
_CONFIG = 0x41
_DEFINE_SECTION = 0x42
_SET_TIMEOUTS = 0x43
_WORKLOAD_REQUEST = 0x44
_ACK = 0x45
_MAX_PAYLOAD = 1 << 20
# Shared-memory heartbeat region (ftwire.ShmSize/ShmOffCount/ShmOffTime):
# uint64 word 0 = heartbeat count, word 1 = CLOCK_MONOTONIC ns of the last one.
_SHM_SIZE = 4096
_SHM_COUNT = 0
_SHM_TIME = 1
# Section-event ring (ftwire.ShmOffTail/ShmOffHead/ShmRingOff/ShmRingCap),
# in uint64 words: the client writes an event's 4 words (kind, id,
# iteration, CLOCK_MONOTONIC ns) at slot tail % cap, then stores tail + 1;
# the monitor stores how many it consumed at head.
_SHM_TAIL = 8
_SHM_HEAD = 16
_RING_WORD = 512
_RING_CAP = 1024
_SHM_REGION_SIZE = 4096 + _RING_CAP * 32
_EV_OPEN, _EV_CLOSE, _EV_CLOSE_ALL, _EV_OPEN_ITER = 1, 2, 3, 4

SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
# Set by ft-launcher beside SOCKET_ENV: the protocol its rank monitor speaks.
# nvidia-resiliency-ext's ft_launcher sets SOCKET_ENV too, for a monitor that
# speaks pickle frames; this client must not wait on it.
PROTOCOL_ENV = "FT_RANK_MONITOR_PROTOCOL"
PROTOCOL = "ftl1"
LAUNCHER_SOCKET_ENV = "FT_LAUNCHER_IPC_SOCKET"
FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"

log = logging.getLogger("ft_launcher_client")


class RankMonitorClientError(Exception):
    """Raised on protocol or usage errors."""


class WorkloadAction(enum.Enum):
    Continue = 0
    ExcludeThisNode = 1
    ShutdownWorkload = 2


def _uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def frame(t, payload):
    """One message of the rank-monitor wire protocol: its type byte, the
    payload's length as a uvarint, the payload (docs/protocol.md)."""
    return bytes((t,)) + _uvarint(len(payload)) + payload


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RankMonitorClientError("connection closed by the rank monitor")
        buf += chunk
    return bytes(buf)


def _recv_magic_fd(sock):
    """Read the 4-byte magic with recvmsg; return it and the fd attached to
    it (SCM_RIGHTS), or None."""
    buf, fd = b"", None
    while len(buf) < 4:
        data, anc, _flags, _addr = sock.recvmsg(4 - len(buf), socket.CMSG_SPACE(4 * 4))
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                for f in fds:
                    if fd is None:
                        fd = f
                    else:
                        os.close(f)
        if not data:
            if fd is not None:
                os.close(fd)
            raise RankMonitorClientError("connection closed by the rank monitor")
        buf += data
    return buf, fd


def _read_frame(sock, want, magic=None):
    if (magic if magic is not None else _recv_exact(sock, 4)) != _MAGIC:
        raise RankMonitorClientError("bad reply magic")
    t = _recv_exact(sock, 1)[0]
    if t != want:
        raise RankMonitorClientError("unexpected reply type 0x%02x" % t)
    n, shift = 0, 0
    while True:
        b = _recv_exact(sock, 1)[0]
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    if n > _MAX_PAYLOAD:
        raise RankMonitorClientError("reply too large")
    return json.loads(_recv_exact(sock, n).decode())


def _check_protocol():
    """Refuse, before connecting, a rank monitor that does not speak this
    client's protocol. Without PROTOCOL_ENV (launchers before it existed),
    a rank started by ft-launcher still has FT_LAUNCHER_RESTARTS_USED; one
    with TORCHELASTIC_RUN_ID and neither was started by another launcher,
    such as nvidia-resiliency-ext's ft_launcher, whose monitor would leave
    the handshake unanswered."""
    proto = os.environ.get(PROTOCOL_ENV)
    if proto is not None and proto != PROTOCOL:
        raise RankMonitorClientError(
            "%s=%r: the rank monitor speaks another protocol than this client's %r; "
            "use the ft_launcher_client that comes with that launcher" % (PROTOCOL_ENV, proto, PROTOCOL))
    if proto is None and "TORCHELASTIC_RUN_ID" in os.environ and "FT_LAUNCHER_RESTARTS_USED" not in os.environ:
        raise RankMonitorClientError(
            "%s is set by a launcher other than ft-launcher (no %s): nvidia-resiliency-ext's ft_launcher "
            "speaks pickle frames, so use its nvidia_resiliency_ext.fault_tolerance.RankMonitorClient "
            "there, or start the job with ft-launcher" % (SOCKET_ENV, PROTOCOL_ENV))


def _env_int(name, default=-1):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


class RankMonitorClient:
    """Client of one rank monitor; the nvrx RankMonitorClient API.

    When FT_RANK_MONITOR_IPC_SOCKET is unset every call is a no-op (one
    warning).
    """

    # Ask for shared-memory heartbeats at init_workload_monitoring (set to
    # False, on the class or an instance, for socket heartbeats).
    use_shared_memory = True
    # Section events through the shared region's ring (with
    # use_shared_memory); False sends them over the socket.
    use_section_ring = True
    # Register for in-process restarts (ft_launcher_client.inprocess sets
    # it; the session then receives Rejoin notices after Config).
    inprocess = False

    def __init__(self):
        self.cfg = None
        self.hb_timeouts = None
        self.section_timeouts = None
        self.is_initialized = False
        self._sock = None
        self._noop = False
        self._ids = {}
        self._calc = None
        self._loaded_state = None
        self._warned = False
        self._shm = None  # mmap of the shared heartbeat region
        self._shm_words = None  # uint64 view of it
        self._shm_count = 0
        self._ring = False  # section events go through the shared region
        self._tail = 0
        self._head = 0
        self._lock = threading.Lock()  # orders ring pushes from several threads
        # Set while ft_launcher_client.inprocess replaces the session at an
        # in-process restart: heartbeats from other threads are no-ops then.
        self._rejoining = False

    # -- session ---------------------------------------------------------

    def init_workload_monitoring(self, iteration=None, num_warmup_iters=None):
        if self.is_initialized:
            raise RankMonitorClientError("init_workload_monitoring called twice")
        self._ids = {}  # a new session knows no section names yet
        path = os.environ.get(SOCKET_ENV)
        if not path:
            self._noop = True
            self._warn_noop()
            self.is_initialized = True
            return
        _check_protocol()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60.0)
        try:
            sock.connect(path)
            hello = {
                "global_rank": _env_int("RANK"),
                "local_rank": _env_int("LOCAL_RANK"),
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "client": "ft_launcher_client-py/1",
                "shm": self.use_shared_memory,
                "shm_sections": self.use_shared_memory and self.use_section_ring,
            }
            if iteration is not None:
                hello["iteration"] = int(iteration)
            if num_warmup_iters is not None:
                hello["num_warmup_iters"] = int(num_warmup_iters)
            if self.inprocess:
                hello["inprocess"] = True
            sock.sendall(_MAGIC + frame(_HELLO, json.dumps(hello).encode()))
            magic, fd = _recv_magic_fd(sock)
            try:
                cfg = _read_frame(sock, _CONFIG, magic)
                if fd is not None and cfg.get("shm"):
                    self._map_shm(fd, bool(cfg.get("shm_sections")))
            finally:
                if fd is not None:
                    os.close(fd)
        except (OSError, ValueError) as e:
            sock.close()
            raise RankMonitorClientError("cannot connect to rank monitor at %s: %s" % (path, e)) from e
        sock.settimeout(None)
        self._sock = sock
        self.cfg = types.SimpleNamespace(**cfg)
        self.hb_timeouts = types.SimpleNamespace(
            initial=cfg.get("initial_rank_heartbeat_timeout"),
            subsequent=cfg.get("rank_heartbeat_timeout"),
            were_calculated=False,
        )
        self.section_timeouts = types.SimpleNamespace(
            section=dict(cfg.get("rank_section_timeouts") or {}),
            out_of_section=cfg.get("rank_out_of_section_timeout"),
            calculated_sections=set(),
            is_out_of_section_calculated=False,
        )
        self._calc = TimeoutsCalc(self.section_timeouts.section.keys(), cfg.get("safety_factor", 5.0))
        self.is_initialized = True
        if self._loaded_state is not None:
            state, self._loaded_state = self._loaded_state, None
            self.load_state_dict(state)

    def _map_shm(self, fd, ring):
        try:
            size = _SHM_REGION_SIZE if ring else _SHM_SIZE
            if os.fstat(fd).st_size < size:
                raise ValueError("shared region too small")
            self._shm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            # An aligned native 8-byte item store is a single store on
            # x86-64/arm64, so the monitor never reads a torn value.
            self._shm_words = memoryview(self._shm).cast("Q")
            self._shm_count = 0
            self._ring = ring
            self._tail = self._head = 0
        except (OSError, ValueError) as e:
            # The monitor accepts socket heartbeats too.
            log.debug("no shared-memory heartbeats, using the socket: %s", e)
            self._unmap_shm()

    def _unmap_shm(self):
        self._ring = False
        if self._shm_words is not None:
            self._shm_words.release()
            self._shm_words = None
        if self._shm is not None:
            self._shm.close()
            self._shm = None

    @property
    def section_ring(self):
        """True when section events go through shared memory."""
        return self._ring

    @property
    def shared_memory_heartbeats(self):
        """True when heartbeats go through shared memory."""
        return self._shm_words is not None

    def shutdown_workload_monitoring(self):
        self._unmap_shm()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        self.is_initialized = False

    def _warn_noop(self):
        if not self._warned:
            self._warned = True
            log.warning("%s is not set; fault-tolerance calls are no-ops", SOCKET_ENV)

    def _ready(self):
        if self._sock is not None:
            return True
        if self._noop or self._rejoining:
            return False
        if not os.environ.get(SOCKET_ENV):
            self._noop = True
            self._warn_noop()
            return False
        raise RankMonitorClientError("init_workload_monitoring was not called")

    # -- hot path --------------------------------------------------------

    def send_heartbeat(self):
        sock, w = self._sock, self._shm_words
        if sock is None and not self._ready():
            return
        try:
            self._calc.heartbeat()
            if w is not None:
                # Time first, then the count: the monitor reads the count first.
                w[_SHM_TIME] = time.monotonic_ns()
                self._shm_count += 1
                w[_SHM_COUNT] = self._shm_count
                return
            sock.send(_HEARTBEAT)
        except (AttributeError, ValueError, OSError):
            # The session this call began with went away under it (another
            # thread shut it down: an in-process restart replaces it, and
            # the next heartbeat goes to the new one).
            if self._rejoining or sock is not self._sock or w is not self._shm_words:
                return
            raise

    def _push(self, kind, ident, iteration):
        """Append one section event to the ring and publish it (never drops
        or reorders: waits while the ring is full)."""
        with self._lock:
            at = time.monotonic_ns()
            t = self._tail
            if t - self._head >= _RING_CAP:
                self._wait_space()
            w = self._shm_words
            b = _RING_WORD + (t % _RING_CAP) * 4
            w[b] = kind
            w[b + 1] = ident
            w[b + 2] = iteration
            w[b + 3] = at
            self._tail = t + 1
            w[_SHM_TAIL] = t + 1  # publishes the words above (stores are ordered on x86-64)

    def _wait_space(self):
        # The monitor drains at least every 10 ms and sooner while busy:
        # yield for up to 1 ms, then poll the socket (which also notices a
        # monitor that went away: it never writes after Config).
        w = self._shm_words
        spin_until = time.monotonic() + 0.001
        poller = None
        while True:
            self._head = w[_SHM_HEAD]
            if self._tail - self._head < _RING_CAP:
                return
            if time.monotonic() < spin_until:
                time.sleep(0)
                continue
            if poller is None:
                poller = select.poll()
                poller.register(self._sock, select.POLLIN)
            if poller.poll(1):
                self._head = w[_SHM_HEAD]
                if self._tail - self._head < _RING_CAP:
                    return
                raise RankMonitorClientError("section ring full and the monitor closed the connection")

    def _section_id(self, name, out):
        i = self._ids.get(name)
        if i is None:
            i = len(self._ids)
            self._ids[name] = i
            body = _uvarint(i) + name.encode()
            out += frame(_DEFINE_SECTION, body)
        return i

    def start_section(self, section, iteration=None):
        if self._sock is None and not self._ready():
            return
        out = bytearray()
        i = self._section_id(section, out)
        if self._ring:
            # The definition goes over the socket before the event using it.
            if out:
                self._sock.sendall(out)
            self._calc.open(section)
            if iteration is None:
                self._push(_EV_OPEN, i, 0)
            else:
                self._push(_EV_OPEN_ITER, i, max(int(iteration), 0))
            return
        if iteration is None:
            out.append(_SECTION_OPEN)
            out += _uvarint(i)
        else:
            out.append(_SECTION_OPEN_ITER)
            out += _uvarint(i) + _uvarint(max(int(iteration), 0))
        self._calc.open(section)
        self._sock.send(out)

    def end_section(self, section):
        if self._sock is None and not self._ready():
            return
        out = bytearray()
        i = self._section_id(section, out)
        if self._ring:
            if out:
                self._sock.sendall(out)
            self._calc.close(section)
            self._push(_EV_CLOSE, i, 0)
            return
        out.append(_SECTION_CLOSE)
        out += _uvarint(i)
        self._calc.close(section)
        self._sock.send(out)

    def end_all_sections(self):
        if self._sock is None and not self._ready():
            return
        self._calc.close_all()
        if self._ring:
            self._push(_EV_CLOSE_ALL, 0, 0)
            return
        self._sock.send(_SECTION_CLOSE_ALL)

    # -- timeouts --------------------------------------------------------

    def _send_timeouts(self, update):
        self._sock.sendall(frame(_SET_TIMEOUTS, json.dumps(update).encode()))

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready=False):
        """Compute heartbeat timeouts from this rank's observed timing
        (safety_factor × max) and send them to the monitor. Returns True if
        they were set."""
        if self._sock is None and not self._ready():
            return False
        c = self._calc
        if not c.hb_ready():
            if skip_if_not_ready:
                return False
            raise RankMonitorClientError("not enough heartbeats observed to calculate timeouts")
        initial = c.safety_factor * c.initial_max
        subsequent = c.safety_factor * c.subsequent_max
        cur = self.hb_timeouts
        if cur.were_calculated and cur.initial and cur.subsequent:
            initial = 0.5 * initial + 0.5 * cur.initial
            subsequent = 0.5 * subsequent + 0.5 * cur.subsequent
        self.hb_timeouts = types.SimpleNamespace(initial=initial, subsequent=subsequent, were_calculated=True)
        self._send_timeouts({"heartbeat": vars(self.hb_timeouts)})
        return True

    def calculate_and_set_section_timeouts(self, selected_sections=None, calc_out_of_section=True, skip_if_not_ready=False):
        """Compute section (and out-of-section) timeouts from this rank's
        observed timing and send them to the monitor. Returns True if set."""
        if self._sock is None and not self._ready():
            return False
        c = self._calc
        st = self.section_timeouts
        names = list(st.section) if selected_sections is None else list(selected_sections)
        missing = [n for n in names if c.section_max.get(n, 0) <= 0]
        oos = c.current_oos() if calc_out_of_section else 0
        if missing or (calc_out_of_section and oos <= 0):
            if skip_if_not_ready:
                return False
            raise RankMonitorClientError("sections not observed yet: %s" % (missing or ["out_of_section"]))
        for n in names:
            v = c.safety_factor * c.section_max[n]
            if n in st.calculated_sections and st.section.get(n):
                v = 0.5 * v + 0.5 * st.section[n]
            st.section[n] = v
            st.calculated_sections.add(n)
        if calc_out_of_section:
            v = c.safety_factor * oos
            if st.is_out_of_section_calculated and st.out_of_section:
                v = 0.5 * v + 0.5 * st.out_of_section
            st.out_of_section = v
            st.is_out_of_section_calculated = True
        self._send_timeouts({"section": self._section_state()})
        return True

    def _section_state(self):
        st = self.section_timeouts
        return {
            "section": dict(st.section),
            "out_of_section": st.out_of_section,
            "calculated_sections": sorted(st.calculated_sections),
            "is_out_of_section_calculated": st.is_out_of_section_calculated,
        }

    def state_dict(self):
        """nvrx-compatible {"current_timeouts": {...}} with calculated values."""
        cur = {}
        hb = self.hb_timeouts
        if hb is not None and hb.were_calculated:
            cur["heartbeat"] = vars(hb).copy()
        st = self.section_timeouts
        if st is not None and (st.calculated_sections or st.is_out_of_section_calculated):
            cur["section"] = self._section_state()
        return {"current_timeouts": cur}

    def load_state_dict(self, state):
        """Apply persisted timeouts: sent right away, or after init when
        called before init_workload_monitoring."""
        if not self.is_initialized:
            self._loaded_state = state
            return
        if self._sock is None:
            return
        cur = (state or {}).get("current_timeouts", {})
        update = {}
        if cur.get("heartbeat"):
            hb = cur["heartbeat"]
            self.hb_timeouts = types.SimpleNamespace(
                initial=hb.get("initial"), subsequent=hb.get("subsequent"),
                were_calculated=bool(hb.get("were_calculated")))
            update["heartbeat"] = vars(self.hb_timeouts)
        if cur.get("section"):
            s = cur["section"]
            self.section_timeouts = types.SimpleNamespace(
                section=dict(s.get("section") or {}), out_of_section=s.get("out_of_section"),
                calculated_sections=set(s.get("calculated_sections") or []),
                is_out_of_section_calculated=bool(s.get("is_out_of_section_calculated")))
            update["section"] = self._section_state()
        if update:
            self._send_timeouts(update)


def request_workload_action(action, description="", global_rank=None, path=None):
    """Send a workload-control request to the launcher and wait for its ack."""
    if not path:
        path = os.environ.get(LAUNCHER_SOCKET_ENV)
        if not path:
            raise RankMonitorClientError("%s is not set" % LAUNCHER_SOCKET_ENV)
        _check_protocol()
    if isinstance(action, WorkloadAction):
        action = action.name
    if global_rank is None:
        global_rank = _env_int("RANK")
    req = {"global_rank": int(global_rank), "action": action, "description": description}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60.0)
        s.connect(path)
        s.sendall(_MAGIC + frame(_WORKLOAD_REQUEST, json.dumps(req).encode()))
        ack = _read_frame(s, _ACK)
    if not ack.get("ok"):
        raise RankMonitorClientError("request refused: %s" % ack.get("error"))


def write_finished_flag():
    """Touch $FAULT_TOL_FINISHED_FLAG_FILE (training is complete). Returns the
    path, or None when the variable is unset."""
    path = os.environ.get(FINISHED_FLAG_ENV)
    if not path:
        log.warning("%s is not set; no finished flag written", FINISHED_FLAG_ENV)
        return None
    with open(path, "a"):
        os.utime(path, None)
    return path
