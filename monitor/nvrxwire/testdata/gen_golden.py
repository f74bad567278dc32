"""Regenerate testdata/golden: run with /usr/bin/python3 from this directory's parent.

    cd monitor/nvrxwire && /usr/bin/python3 testdata/gen_golden.py

Writes golden/<name>.p<protocol>.bin (raw pickle payload, NOT framed: the Go
test adds no header) for protocols 2-5 and golden/manifest.json with the
expected decoded value of each file:
  kind "message": expect is the json.Marshal form of the Go struct that
                  DecodeMessage returns (field names are Go's).
  kind "generic": expect is the canonical form of Decode's result
                  (see canon() below and canonical() in the Go tests);
                  DecodeMessage must reject these.
Standard library only.
"""

import base64
import json
import os
import signal
import struct
import sys
from multiprocessing.reduction import ForkingPickler

sys.dont_write_bytecode = True  # keep testdata free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standins as s  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def b64(b):
    return base64.b64encode(b).decode()


def rank_info(g, l, host, pid):
    return {"GlobalRank": g, "LocalRank": l, "Host": host, "PID": pid}


def canon(v):
    """Canonical JSON form of a decoded value, mirrored by canonical() in Go."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, signal.Signals):
        return {"$obj": "signal.Signals", "args": [canon(int(v))]}
    if isinstance(v, int):
        return {"$int": str(v)}
    if isinstance(v, float):
        return {"$float": struct.pack(">d", v).hex()}
    if isinstance(v, bytes):
        return {"$bytes": v.hex()}
    if isinstance(v, bytearray):
        return {"$bytearray": bytes(v).hex()}
    if isinstance(v, list):
        return [canon(x) for x in v]
    if isinstance(v, tuple):
        return {"$tuple": [canon(x) for x in v]}
    if isinstance(v, dict):
        return {"$dict": [[canon(k), canon(x)] for k, x in v.items()]}
    if isinstance(v, (set, frozenset)):
        items = sorted((canon(x) for x in v), key=lambda c: json.dumps(c, sort_keys=True))
        return {"$frozenset" if isinstance(v, frozenset) else "$set": items}
    if isinstance(v, (s.SectionAction, s.WorkloadAction)):
        return {"$obj": type(v).__module__ + "." + type(v).__name__, "args": [canon(v.value)]}
    return {"$obj": type(v).__module__ + "." + type(v).__qualname__, "args": [], "state": canon(dict(v.__dict__))}


def ft_config():
    cfg = s.FaultToleranceConfig()
    cfg.__dict__.update(
        workload_check_interval=5.0, initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=60.0,
        rank_section_timeouts={"setup": 600.0, "step": 180.0, "checkpointing": None},
        rank_out_of_section_timeout=None, safety_factor=5.0, rank_termination_signal=signal.SIGKILL,
        log_level=20, skip_section_response=True, segment=None, max_no_progress_cycles=3)
    return cfg


def vectors():
    """(name, object, kind, expect) for every message shape and version."""
    key = bytes(range(32))
    yield "authkey", s.AuthkeyMsg(key), "message", {"Authkey": b64(key)}

    ri = s.RankInfo(global_rank=3, local_rank=1, host="node-a", pid=4242)
    yield "init_v06", s.shaped(s.InitMsg, rank_info=ri, iteration=100, num_warmup_iters=5), "message", {
        "RankInfo": rank_info(3, 1, "node-a", 4242), "HasIteration": True, "Iteration": 100, "NumWarmupIters": 5}
    yield "init_v06_none", s.shaped(s.InitMsg, rank_info=ri, iteration=None, num_warmup_iters=None), "message", {
        "RankInfo": rank_info(3, 1, "node-a", 4242), "HasIteration": True, "Iteration": None, "NumWarmupIters": None}
    # <=0.5: only rank_info; global_rank from the RANK env var is a str.
    ri_env = s.RankInfo(global_rank="7", local_rank=-1, host="h\u00f6st-\u2603", pid=2**31 + 5)
    yield "init_v05_envrank", s.shaped(s.InitMsg, rank_info=ri_env), "message", {
        "RankInfo": rank_info(7, -1, "h\u00f6st-\u2603", 2**31 + 5), "HasIteration": False,
        "Iteration": None, "NumWarmupIters": None}
    # v0.1-0.2 RankInfo(rank, host, pid).
    ri_v01 = s.shaped(s.RankInfo, rank=12, host="x" * 300, pid=99)
    yield "init_v01", s.shaped(s.InitMsg, rank_info=ri_v01), "message", {
        "RankInfo": rank_info(12, -1, "x" * 300, 99), "HasIteration": False, "Iteration": None, "NumWarmupIters": None}

    yield "heartbeat", s.HeartbeatMsg(3, {}), "message", {"Rank": 3, "StateLen": 0}
    yield "heartbeat_state", s.HeartbeatMsg(70000, {"a": 1, "b": [1, 2]}), "message", {"Rank": 70000, "StateLen": 2}
    yield "heartbeat_v01", s.shaped(s.HeartbeatMsg, rank=1, state_dict_for_chkpt=None), "message", {"Rank": 1, "StateLen": 0}

    yield "section_open_v06", s.SectionMsg(0, "step", s.SectionAction.OPEN, 12), "message", {
        "Rank": 0, "Section": "step", "Action": 1, "Iteration": 12}
    yield "section_close_v04", s.shaped(s.SectionMsg, rank=2, section="checkpointing", action=s.SectionAction.CLOSE), "message", {
        "Rank": 2, "Section": "checkpointing", "Action": 2, "Iteration": None}
    yield "section_close_all", s.SectionMsg(5, None, s.SectionAction.CLOSE_ALL, None), "message", {
        "Rank": 5, "Section": None, "Action": 3, "Iteration": None}

    hb = s.HeartbeatTimeouts(initial=123.5, subsequent=56.25, were_calculated=True)
    yield "update_hb", s.shaped(s.UpdateConfigMsg, hb_timeouts=hb, section_timeouts=None), "message", {
        "HB": {"Initial": 123.5, "Subsequent": 56.25, "WereCalculated": True}, "Sections": None,
        "CurrentCycle": None, "LegacyInitial": None, "LegacySubsequent": None}
    st = s.SectionTimeouts(section={"setup": 600.0, "step": 180, "checkpointing": None}, out_of_section=300.0,
                           calculated_sections={"step", "setup"}, is_out_of_section_calculated=True)
    hb_none = s.HeartbeatTimeouts()
    yield "update_sections", s.UpdateConfigMsg(hb_none, st, None), "message", {
        "HB": {"Initial": None, "Subsequent": None, "WereCalculated": None},
        "Sections": {"Section": {"setup": 600.0, "step": 180.0, "checkpointing": None}, "OutOfSection": 300.0,
                     "CalculatedSections": ["setup", "step"], "IsOutOfSectionCalculated": True},
        "CurrentCycle": None, "LegacyInitial": None, "LegacySubsequent": None}
    yield "update_empty_sections", s.UpdateConfigMsg(None, s.SectionTimeouts(), None), "message", {
        "HB": None, "Sections": {"Section": {}, "OutOfSection": None, "CalculatedSections": [],
                                 "IsOutOfSectionCalculated": False},
        "CurrentCycle": None, "LegacyInitial": None, "LegacySubsequent": None}
    yield "update_cycle", s.UpdateConfigMsg(None, None, 4), "message", {
        "HB": None, "Sections": None, "CurrentCycle": 4, "LegacyInitial": None, "LegacySubsequent": None}
    yield "update_v01", s.shaped(s.UpdateConfigMsg, new_initial_heartbeat_timeout=3600.0, new_heartbeat_timeout=2700), "message", {
        "HB": None, "Sections": None, "CurrentCycle": None, "LegacyInitial": 3600.0, "LegacySubsequent": 2700.0}

    req = s.WorkloadControlRequest(s.WorkloadAction.ExcludeThisNode, "bad gpu")
    yield "workload_exclude", (5, req), "message", {"GlobalRank": 5, "Action": 1, "Description": "bad gpu"}
    req = s.WorkloadControlRequest(s.WorkloadAction.ShutdownWorkload)
    yield "workload_shutdown", (0, req), "message", {"GlobalRank": 0, "Action": 2, "Description": "<not set>"}

    yield "control_close", "close_worker_ipc_connection", "message", "close_worker_ipc_connection"
    yield "control_shutdown", "shutdown", "message", "shutdown"

    # Replies and other values DecodeMessage must refuse but Decode must read.
    ok = s.OkMsg(cfg=ft_config())
    yield "okmsg_cfg", ok, "generic", canon(ok)
    yield "okmsg_empty", s.OkMsg(), "generic", canon(s.OkMsg())
    yield "errormsg", s.ErrorMsg("section already open"), "generic", canon(s.ErrorMsg("section already open"))
    yield "bytes_ok", b"ok", "generic", canon(b"ok")
    misc = {"ints": [0, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**63 - 1, -2**63, 2**64, -2**100],
            "floats": [0.0, -0.0, 1.5, 1e308, float("inf")],
            "b": b"\x00\xff", "e": b"", "ba": bytearray(b"xy"), "fs": frozenset({"a"}), "set": {1, 2},
            "t": (1, (2, 3), ()), "nested": {"k": [{"x": None}]}, (1, "a"): True, 7: False, "u": "\u00e9\U0001f600"}
    yield "generic_misc", misc, "generic", canon(misc)
    yield "signal_global", signal.SIGTERM, "generic", canon(signal.SIGTERM)
    shared = ["same"] * 3
    yield "shared_refs", {"a": shared, "b": shared}, "generic", canon({"a": shared, "b": shared})


def _reduce_by_value(self, proto):
    return self.__class__, (self._value_,)


def all_vectors():
    """vectors() as this interpreter pickles them, plus the enum-carrying ones
    re-pickled the other way: CPython 3.11 pickles Enum members as
    getattr(Class, 'NAME') while 3.8-3.10 and 3.12+ use Class(value)."""
    yield from vectors()
    saved = {c: c.__dict__.get("__reduce_ex__") for c in (s.SectionAction, s.WorkloadAction)}
    for c in saved:
        c.__reduce_ex__ = _reduce_by_value
    try:
        for name, obj, kind, expect in vectors():
            if name.startswith(("section_", "workload_")):
                yield name + "_byvalue", obj, kind, expect
    finally:
        for c, orig in saved.items():
            if orig is None:
                del c.__reduce_ex__
            else:
                c.__reduce_ex__ = orig


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Set iteration order depends on str hashing; pin it so output is reproducible.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".bin"):
            os.remove(os.path.join(OUT, f))
    manifest = []
    for name, obj, kind, expect in all_vectors():
        for proto in (2, 3, 4, 5):
            fname = f"{name}.p{proto}.bin"
            payload = bytes(ForkingPickler.dumps(obj, proto))
            with open(os.path.join(OUT, fname), "wb") as fh:
                fh.write(payload)
            manifest.append({"file": fname, "name": name, "protocol": proto, "kind": kind, "expect": expect})
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump({"python": sys.version.split()[0], "vectors": manifest}, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"wrote {len(manifest)} vectors to {OUT}")


if __name__ == "__main__":
    main()
