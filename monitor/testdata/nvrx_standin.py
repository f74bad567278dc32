# Stand-in nvrx client: classes with nvrx's module and class names (written
# for this test, not copied), pickled and framed like nvrx (4-byte big-endian
# length + pickle). Prints one JSON line describing what the monitor replied.
import enum
import json
import os
import pickle
import socket
import struct
import sys
import types

DATA = "nvidia_resiliency_ext.fault_tolerance.data"
CONFIG = "nvidia_resiliency_ext.fault_tolerance.config"


def module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
    return sys.modules[name]


data, config = module(DATA), module(CONFIG)


def cls(mod, name, base=object):
    c = type(name, (base,), {"__module__": mod.__name__})
    setattr(mod, name, c)
    return c


for n in ["AuthkeyMsg", "InitMsg", "RankInfo", "HeartbeatMsg", "SectionMsg", "UpdateConfigMsg",
          "OkMsg", "ErrorMsg", "WorkloadControlRequest", "HeartbeatTimeouts", "SectionTimeouts"]:
    cls(data, n)
cls(config, "FaultToleranceConfig")
SectionAction = enum.Enum("SectionAction", {"OPEN": 1, "CLOSE": 2, "CLOSE_ALL": 3}, module=DATA)
data.SectionAction = SectionAction
WorkloadAction = enum.Enum("WorkloadAction", {"Continue": 0, "ExcludeThisNode": 1, "ShutdownWorkload": 2}, module=DATA)
data.WorkloadAction = WorkloadAction


def obj(c, **kw):
    o = c.__new__(c)
    o.__dict__.update(kw)
    return o


def send(s, o):
    b = pickle.dumps(o, protocol=4)
    s.sendall(struct.pack(">I", len(b)) + b)


def recv(s, timeout=10.0):
    s.settimeout(timeout)
    hdr = b""
    while len(hdr) < 4:
        chunk = s.recv(4 - len(hdr))
        if not chunk:
            raise EOFError("closed")
        hdr += chunk
    (n,) = struct.unpack(">I", hdr)
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            raise EOFError("closed")
        body += chunk
    return pickle.loads(body)


def nothing_pending(s):
    try:
        recv(s, timeout=0.3)
        return False
    except socket.timeout:
        return True


def rank_session(version):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
    out = {}
    send(s, obj(data.AuthkeyMsg, authkey=b"k" * 32))
    out["authkey_reply"] = type(recv(s)).__name__
    info = obj(data.RankInfo, global_rank=3, local_rank=0, host="h", pid=os.getpid())
    if version == "0.6":
        init = obj(data.InitMsg, rank_info=info, iteration=10, num_warmup_iters=1)
    else:
        init = obj(data.InitMsg, rank_info=info)
    send(s, init)
    r = recv(s)
    out["init_reply"] = type(r).__name__
    skip = r.cfg.skip_section_response
    out["skip_section_response"] = skip
    out["cfg_step_timeout"] = r.cfg.rank_section_timeouts.get("step")
    out["cfg_signal"] = int(r.cfg.rank_termination_signal)
    replies = []
    send(s, obj(data.HeartbeatMsg, rank=3, state={}))
    if not skip:
        replies.append(type(recv(s)).__name__)
    for action in (1, 1, 2, 2):  # open, open again, close, close again
        send(s, obj(data.SectionMsg, rank=3, section="step", action=SectionAction(action), iteration=11))
        if not skip:
            r = recv(s)
            replies.append(type(r).__name__ + (":" + r.cause if hasattr(r, "cause") else ""))
    send(s, obj(data.UpdateConfigMsg, hb_timeouts=obj(data.HeartbeatTimeouts, initial=30.0, subsequent=20.0, were_calculated=True),
                section_timeouts=None, current_cycle=None))
    replies.append(type(recv(s)).__name__)
    out["replies"] = replies
    out["nothing_pending"] = nothing_pending(s)
    s.close()
    return out


def garbage():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
    s.sendall(struct.pack(">I", 5) + b"\x80\x04junk")
    try:
        recv(s)
        return {"closed": False}
    except (EOFError, ConnectionResetError):
        return {"closed": True}


def workload():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FT_LAUNCHER_IPC_SOCKET"])
    send(s, (4, obj(data.WorkloadControlRequest, action=WorkloadAction(2), description="stop please")))
    r = recv(s)
    s.close()
    return {"reply": r.decode() if isinstance(r, bytes) else repr(r)}


mode = sys.argv[1]
if mode == "garbage":
    res = garbage()
elif mode == "workload":
    res = workload()
else:
    res = rank_session(mode)
print(json.dumps(res), flush=True)
if len(sys.argv) > 2:
    import time
    time.sleep(float(sys.argv[2]))
