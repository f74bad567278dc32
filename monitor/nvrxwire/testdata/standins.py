"""Stand-in classes carrying nvrx's exact module and class names.

Pickle records only a class's module and qualified name plus the instance
__dict__, so these stand-ins produce the same streams as the real nvrx
classes without importing nvrx or torch. Standard library only.

Older client shapes (v0.1-0.2, <=0.5) differ only in which attributes an
instance has; `shaped()` builds such instances by filling __dict__ directly,
which pickles exactly like an instance of the older class would.
"""

import dataclasses
import enum
import pickle
import struct
import sys
import types
from typing import Dict, Optional, Set

DATA = "nvidia_resiliency_ext.fault_tolerance.data"
CONFIG = "nvidia_resiliency_ext.fault_tolerance.config"


def _module(name):
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        sys.modules[name] = mod
    return mod


for _name in ("nvidia_resiliency_ext", "nvidia_resiliency_ext.fault_tolerance", DATA, CONFIG):
    _module(_name)
data = sys.modules[DATA]
config = sys.modules[CONFIG]


def _register(mod, cls):
    cls.__module__ = mod.__name__
    setattr(mod, cls.__name__, cls)
    return cls


@dataclasses.dataclass
class RankInfo:
    global_rank: int
    local_rank: int
    host: str
    pid: int


@dataclasses.dataclass
class HeartbeatTimeouts:
    initial: Optional[float] = None
    subsequent: Optional[float] = None
    were_calculated: Optional[bool] = None


@dataclasses.dataclass
class SectionTimeouts:
    section: Dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    out_of_section: Optional[float] = None
    calculated_sections: Set[str] = dataclasses.field(default_factory=set)
    is_out_of_section_calculated: bool = False


class AuthkeyMsg:
    def __init__(self, authkey):
        self.authkey = authkey


class InitMsg:
    pass


class HeartbeatMsg:
    def __init__(self, rank, state=None):
        self.rank = rank
        self.state = state


class SectionAction(enum.Enum):
    OPEN = 1
    CLOSE = 2
    CLOSE_ALL = 3


class SectionMsg:
    def __init__(self, rank, section, action, iteration=None):
        self.rank = rank
        self.section = section
        self.action = action
        self.iteration = iteration


class UpdateConfigMsg:
    def __init__(self, hb_timeouts=None, section_timeouts=None, current_cycle=None):
        self.hb_timeouts = hb_timeouts
        self.section_timeouts = section_timeouts
        self.current_cycle = current_cycle


class OkMsg:
    def __init__(self, **kwargs):
        for key, value in kwargs.items():
            setattr(self, key, value)


class ErrorMsg:
    def __init__(self, cause="<not set>"):
        self.cause = cause


class WorkloadAction(enum.Enum):
    Continue = 0
    ExcludeThisNode = 1
    ShutdownWorkload = 2


class WorkloadControlRequest:
    def __init__(self, action, description="<not set>"):
        self.action = action
        self.description = description


class FaultToleranceConfig:
    """Plain stand-in: the real one is a dataclass; BUILD fills __dict__ either way."""


for _cls in (RankInfo, HeartbeatTimeouts, SectionTimeouts, AuthkeyMsg, InitMsg, HeartbeatMsg,
             SectionAction, SectionMsg, UpdateConfigMsg, OkMsg, ErrorMsg, WorkloadAction,
             WorkloadControlRequest):
    _register(data, _cls)
_register(config, FaultToleranceConfig)


def shaped(cls, **attrs):
    """An instance of cls whose __dict__ is exactly attrs (older client shapes)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def send(sock, obj):
    """Writes obj as nvrx does: 4-byte big-endian length + pickle."""
    b = pickle.dumps(obj)
    sock.sendall(struct.pack(">I", len(b)) + b)


def recv(sock):
    """Reads one framed pickle, as nvrx's client does."""
    def exact(n):
        b = b""
        while len(b) < n:
            c = sock.recv(n - len(b))
            if not c:
                raise EOFError("monitor closed the connection")
            b += c
        return b
    (n,) = struct.unpack(">I", exact(4))
    return pickle.loads(exact(n))
