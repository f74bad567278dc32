"""Every TCPStore client call of the installed torch against the store the
launcher gave the ranks (ft-launcher's agent store by default).

Run under a launcher with 2 ranks: each rank goes through the calls on the
process group's store and on a TCPStore client of its own, checks each
result, and rank 0 writes $PROBE_OUT (JSON): per call "ok", "unsupported"
(this torch has no such call) or the error. Both ranks then run an
allreduce on the group (--backend, default gloo) and check the sum. Exit 0
only if every call that exists passed.
"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
results = {}


def check(name, fn):
    if fn is None:
        results[name] = "unsupported"
        return
    try:
        fn()
        results[name] = "ok"
    except AttributeError as e:
        results[name] = "unsupported: %s" % e
    except Exception as e:  # record and go on: the report lists every call
        results[name] = "FAILED: %r" % e


def expect(got, want):
    if got != want:
        raise AssertionError("got %r, want %r" % (got, want))


def calls(store, tag):
    k = lambda n: "%s/%s/%d" % (tag, n, rank)  # noqa: E731
    p = lambda n, r: "%s/%s/%d" % (tag, n, r)  # noqa: E731
    t = tag + ":"
    check(t + "set/get", lambda: (store.set(k("a"), b"x" * 1000), expect(store.get(k("a")), b"x" * 1000)))
    check(t + "add", lambda: (store.add(k("n"), 5), expect(store.add(k("n"), -2), 3)))
    check(t + "compare_set", lambda: (
        expect(store.compare_set(k("c"), "", "first"), b"first"),
        expect(store.compare_set(k("c"), "wrong", "x"), b"first"),
        expect(store.compare_set(k("c"), "first", "second"), b"second")))
    check(t + "check", lambda: (expect(store.check([k("a")]), True), expect(store.check([k("absent")]), False)))
    check(t + "delete_key", lambda: (store.set(k("d"), "v"), expect(store.delete_key(k("d")), True),
                                     expect(store.delete_key(k("d")), False)))
    check(t + "num_keys", lambda: expect(store.num_keys() > 0, True))
    check(t + "append", lambda: (store.append(k("ap"), "ab"), store.append(k("ap"), "cd"),
                                 expect(store.get(k("ap")), b"abcd")) if hasattr(store, "append") else None)
    check(t + "multi_set/multi_get", lambda: (store.multi_set([k("m1"), k("m2")], ["1", "22"]),
                                              expect(store.multi_get([k("m1"), k("m2")]), [b"1", b"22"]))
          if hasattr(store, "multi_get") else None)
    check(t + "has_extended_api", (lambda: expect(store.has_extended_api(), True))
          if hasattr(store, "has_extended_api") else None)
    check(t + "queue_push/queue_pop/queue_len", (lambda: (
        store.queue_push(k("q"), "one"), store.queue_push(k("q"), "two"),
        expect(store.queue_len(k("q")), 2), expect(store.queue_pop(k("q")), b"one"),
        expect(store.queue_pop(k("q"), block=False), b"two")))
          if hasattr(store, "queue_push") else None)
    check(t + "list_keys", (lambda: expect(k("a") in [x.decode() if isinstance(x, bytes) else x
                                                      for x in store.list_keys()] or tag == "pg", True))
          if hasattr(store, "list_keys") else None)
    # Cross-rank: each waits for the other's key (concurrent waiters), with a timeout.
    other = (rank + 1) % world
    check(t + "wait (peer's key)", lambda: (store.set(p("w", rank), "here"),
                                            store.wait([p("w", other)], datetime.timedelta(seconds=30)),
                                            expect(store.get(p("w", other)), b"here")))
    check(t + "wait timeout", lambda: expect_timeout(store, k("never")))
    check(t + "get blocks until set", lambda: (store.set(p("late", rank), "v"),
                                               expect(store.get(p("late", other)), b"v")))


def expect_timeout(store, key):
    t0 = time.monotonic()
    try:
        store.wait([key], datetime.timedelta(milliseconds=300))
    except Exception:  # DistStoreError (2.x) or RuntimeError (1.13)
        if time.monotonic() - t0 > 10:
            raise AssertionError("timed out late")
        return
    raise AssertionError("wait on an absent key returned")


dist.init_process_group(backend=backend)
results["env"] = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}
results["torch"] = torch.__version__
store = dist.distributed_c10d._get_default_store()
calls(store, "pg")
own = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                    is_master=False, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
calls(own, "client")
dev = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
x = torch.ones(4, device=dev) * (rank + 1)
dist.all_reduce(x)
results["allreduce"] = "ok" if x.tolist() == [world * (world + 1) / 2] * 4 else "FAILED: %s" % x.tolist()
dist.barrier()
failed = sorted(n for n, v in results.items() if isinstance(v, str) and v.startswith("FAILED"))
if rank == 0:
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump({"results": results, "failed": failed}, f, indent=1, sort_keys=True)
print("rank %d: %d calls, failed: %s" % (rank, len(results), failed or "none"), flush=True)
sys.stdout.flush()
os._exit(1 if failed else 0)
