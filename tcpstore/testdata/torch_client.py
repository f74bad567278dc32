"""Drives torch 1.13's own TCPStore client against the Go server.

Usage: torch_client.py HOST PORT
Prints "CLIENT OK" when every assertion held; any failure raises.
"""
import datetime
import sys
import threading
import time

import torch.distributed as dist

host, port = sys.argv[1], int(sys.argv[2])
timeout = datetime.timedelta(seconds=30)


def client(world_size=1):
    # is_master=False: the server is the launcher's, never this process.
    return dist.TCPStore(host, port, world_size, False, timeout)


store = client()

store.set("k", "v")
assert store.get("k") == b"v", store.get("k")
store.set("k", b"\x00\xffbytes")
assert store.get("k") == b"\x00\xffbytes"

assert store.add("n", 5) == 5
assert store.add("n", -7) == -2
assert store.get("n") == b"-2"

assert store.compare_set("cas", "x", "y") == b"x"  # missing key, non-empty expected
assert store.compare_set("cas", "", "v1") == b"v1"
assert store.compare_set("cas", "nope", "v2") == b"v1"
assert store.compare_set("cas", "v1", "v2") == b"v2"

# torch 1.13's Python API has no check(); CHECK is covered by the Go wire
# client (server_test.go).

store.wait(["k", "n"])
store.wait(["k"], datetime.timedelta(seconds=5))


# A wait that another client answers later.
def set_later():
    time.sleep(0.3)
    client().set("later", "here")


t = threading.Thread(target=set_later)
t.start()
store.wait(["later"], datetime.timedelta(seconds=20))
assert store.get("later") == b"here"
t.join()

# Keys: /k /n /cas /later plus init/ (each client's wait_for_workers ADD).
assert store.num_keys() == 5, store.num_keys()

assert store.delete_key("k") is True
assert store.delete_key("k") is False
assert store.num_keys() == 4, store.num_keys()

# The prefix torchelastic's agent-store path puts in front of every key.
p = dist.PrefixStore("/worker/attempt_3", store)
p.set("x", "1")
assert p.get("x") == b"1"
assert store.get("/worker/attempt_3/x") == b"1"
assert p.add("c", 2) == 2
assert p.compare_set("x", "1", "2") == b"2"
p.wait(["x"], datetime.timedelta(seconds=5))
assert p.num_keys() == store.num_keys()
assert p.delete_key("c") is True

# A wait that times out: a separate client, since torch 1.13 cannot cancel a
# wait and would read the late answer as the reply to its next query.
lone = client()
start = time.monotonic()
try:
    lone.wait(["never"], datetime.timedelta(milliseconds=300))
except RuntimeError as e:
    assert "imeout" in str(e) or "timed out" in str(e), e
else:
    raise AssertionError("wait on a missing key did not time out")
assert time.monotonic() - start < 20
del lone

print("CLIENT OK", flush=True)
