"""Unit tests of ft_launcher_client.inprocess against a fake rank monitor.

The fake speaks FTL1 on a Unix socket: it answers Hello with Config, can
send Rejoin notices and records what the client sends. The process group
calls are replaced (torch is not needed here; the integration tests in
integration/inprocess_test.go run real torch ranks).
"""

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

from ft_launcher_client import inprocess
from ft_launcher_client.client import SOCKET_ENV, frame


def _recv_exact(c, n):
    buf = b""
    while len(buf) < n:
        chunk = c.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _read_uvarint(c):
    n, shift = 0, 0
    while True:
        b = _recv_exact(c, 1)[0]
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n


def _read_len_frame(c):
    return _recv_exact(c, _read_uvarint(c))


class FakeMonitor:
    """One listening rank socket; every session's Hello and messages are kept."""

    def __init__(self, path):
        self.path = path
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.lock = threading.Lock()
        self.hellos = []
        self.reports = []
        self.sessions = []
        self.sections = []  # (session index, "define"/"open"/"close", section id)
        self.connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            assert _recv_exact(c, 4) == b"FTL1"
            assert _recv_exact(c, 1)[0] == 0x40
            hello = json.loads(_read_len_frame(c))
            cfg = {"protocol": 1, "cycle": 0, "rank_heartbeat_timeout": None, "initial_rank_heartbeat_timeout": None,
                   "rank_section_timeouts": {}, "rank_out_of_section_timeout": None, "safety_factor": 5.0}
            c.sendall(b"FTL1" + frame(0x41, json.dumps(cfg).encode()))
            with self.lock:
                self.hellos.append(hello)
                self.sessions.append(c)
                sid = len(self.sessions) - 1
            self.connected.set()
            while True:
                t = c.recv(1)
                if not t:
                    return
                if t[0] >= 0x40:
                    p = _read_len_frame(c)
                    if t[0] == 0x47:
                        with self.lock:
                            self.reports.append(json.loads(p))
                    elif t[0] == 0x42:  # DefineSection: uvarint id, then the name
                        i, shift, k = 0, 0, 0
                        while True:
                            b = p[k]
                            k += 1
                            i |= (b & 0x7F) << shift
                            shift += 7
                            if not b & 0x80:
                                break
                        with self.lock:
                            self.sections.append((sid, "define", i))
                elif t[0] in (0x02, 0x03, 0x05):  # section open/close (and the iteration)
                    i = _read_uvarint(c)
                    if t[0] == 0x05:
                        _read_uvarint(c)
                    with self.lock:
                        self.sections.append((sid, "close" if t[0] == 0x03 else "open", i))
        except (OSError, EOFError):
            return

    def notify(self, **notice):
        with self.lock:
            c = self.sessions[-1]
        c.sendall(frame(0x46, json.dumps(notice).encode()))

    def close(self):
        self.srv.close()
        with self.lock:
            for c in self.sessions:
                c.close()


def notice(rnd, rank=0, world=2):
    return {"round": rnd, "rank": rank, "local_rank": rank, "world_size": world, "master_addr": "127.0.0.1",
            "master_port": 29400 + rnd, "store_prefix": "/worker/attempt_%d" % rnd, "deadline_s": 30}


class FakePG:
    """Stands in for torch.distributed in InProcess."""

    def __init__(self):
        self.inits = []
        self.teardowns = 0

    def install(self, ip):
        ip._init_pg = lambda: self.inits.append(dict(os.environ))
        ip._teardown = self._teardown

    def _teardown(self):
        self.teardowns += 1


class _Fixture(unittest.TestCase):
    """A fake monitor, the environment of rank 0 and a fake process group."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.mon = FakeMonitor(os.path.join(self.dir, "rank.sock"))
        self.saved = {k: os.environ.get(k) for k in (SOCKET_ENV, "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                      "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")}
        os.environ.update({SOCKET_ENV: self.mon.path, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                           "TORCHELASTIC_RESTART_COUNT": "0"})
        self.pg = FakePG()

    def tearDown(self):
        self.mon.close()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def ip(self, **kw):
        ip = inprocess.InProcess(**kw)
        ip.monitor.use_shared_memory = False
        self.pg.install(ip)
        return ip

    def wait_for(self, cond, timeout=5):
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                self.fail("condition not met in %ss" % timeout)
            time.sleep(0.01)

class InProcessTest(_Fixture):
    def test_import_needs_no_torch(self):
        import subprocess
        import sys

        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = "import sys, ft_launcher_client.inprocess; sys.exit('torch' in sys.modules)"
        r = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_registers_in_hello(self):
        ip = self.ip()
        ip.run(lambda ctx: None)
        ip.close()
        # The fake records the hello in its own thread.
        self.wait_for(lambda: self.mon.hellos)
        self.assertTrue(self.mon.hellos[0].get("inprocess"))

    def test_plain_client_does_not_register(self):
        from ft_launcher_client import RankMonitorClient

        c = RankMonitorClient()
        c.use_shared_memory = False
        c.init_workload_monitoring()
        c.shutdown_workload_monitoring()
        self.wait_for(lambda: self.mon.hellos)
        self.assertNotIn("inprocess", self.mon.hellos[0])

    def test_collective_error_then_notice_rejoins(self):
        ip = self.ip()
        calls = []

        def train(ctx):
            calls.append((ctx.round, ctx.restarted, ctx.attempt))
            if len(calls) == 1:
                self.mon.connected.wait(5)
                threading.Timer(0.2, self.mon.notify, kwargs=notice(1, rank=1, world=3)).start()
                raise RuntimeError("Connection closed by peer")
            ctx.step()  # first step after the restart: reported
            return "done"

        self.assertEqual(ip.run(train), "done")
        ip.close()
        self.assertEqual(calls, [(0, False, 0), (1, True, 1)])
        # The group was left and built again with the round's environment.
        self.assertEqual(self.pg.teardowns, 1)
        env = self.pg.inits[1]
        self.assertEqual((env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"], env["TORCHELASTIC_RESTART_COUNT"]),
                         ("1", "3", "29401", "1"))
        # A new monitor session, registered again, then both reports.
        self.wait_for(lambda: len(self.mon.reports) == 2)
        self.assertEqual(len(self.mon.hellos), 2)
        self.assertTrue(self.mon.hellos[1]["inprocess"])
        phases = [r["phase"] for r in self.mon.reports]
        self.assertEqual(phases, ["rejoined", "first_step"])
        last = self.mon.reports[1]
        self.assertEqual(last["round"], 1)
        for k in ("teardown_s", "rejoin_s", "restore_s", "first_step_s"):
            self.assertGreaterEqual(last[k], 0)

    def test_notice_interrupts_a_running_loop(self):
        ip = self.ip()
        seen = []

        def train(ctx):
            seen.append(ctx.round)
            if ctx.round == 0:
                self.mon.connected.wait(5)
                self.mon.notify(**notice(1))
                while True:  # a healthy loop: the notice ends it at a step
                    ctx.step()
                    time.sleep(0.01)
            return ctx.notice["store_prefix"]

        self.assertEqual(ip.run(train), "/worker/attempt_1")
        ip.close()
        self.assertEqual(seen, [0, 1])

    def test_restore_is_called_on_rejoin(self):
        restored = []
        ip = self.ip(restore=lambda ctx: restored.append(ctx.round))

        def train(ctx):
            if not ctx.restarted:
                self.mon.connected.wait(5)
                self.mon.notify(**notice(1))
                raise RuntimeError("peer gone")

        ip.run(train)
        ip.close()
        self.assertEqual(restored, [1])

    def test_no_notice_reraises(self):
        ip = self.ip(notice_wait=0.2)

        def train(ctx):
            raise RuntimeError("a real failure of this rank")

        with self.assertRaisesRegex(RuntimeError, "a real failure"):
            ip.run(train)
        ip.close()
        self.assertEqual(self.pg.teardowns, 0)

    def test_other_exceptions_are_not_waited_for(self):
        ip = self.ip(notice_wait=30)
        t0 = time.monotonic()
        with self.assertRaises(ValueError):
            ip.run(lambda ctx: (_ for _ in ()).throw(ValueError("bug")))
        ip.close()
        self.assertLess(time.monotonic() - t0, 10)

    def test_stale_notice_is_ignored(self):
        ip = self.ip(notice_wait=0.3)

        def train(ctx):
            self.mon.connected.wait(5)
            self.mon.notify(**notice(0))  # the round it already runs in
            time.sleep(0.1)
            ctx.check()
            raise RuntimeError("no newer notice")

        with self.assertRaises(RuntimeError):
            ip.run(train)
        ip.close()

    def test_peer_dies_before_the_first_group(self):
        # init_process_group fails (a peer died while this rank built its
        # first group): this rank is registered, so it waits for the
        # notice and rejoins instead of failing (a failure during the
        # in-process restart would spend a second restart).
        ip = self.ip()
        fails = [RuntimeError("Connection reset by peer")]

        def init_pg():
            self.pg.inits.append(dict(os.environ))
            if fails:
                self.mon.connected.wait(5)
                threading.Timer(0.1, self.mon.notify, kwargs=notice(1)).start()
                raise fails.pop()

        ip._init_pg = init_pg
        rounds = []
        self.assertEqual(ip.run(lambda ctx: rounds.append(ctx.round) or "done"), "done")
        ip.close()
        self.assertEqual(rounds, [1])
        self.assertEqual(len(self.pg.inits), 2)
        self.assertEqual(self.pg.inits[1]["TORCHELASTIC_RESTART_COUNT"], "1")

    def test_fresh_rank_of_a_restarted_round_reports_its_first_step(self):
        # Round 0: no report. A fresh rank of round 2 (started afresh after
        # a restart): first_step of round 2, once.
        for rnd, want in (("0", []), ("2", [(2, "first_step")])):
            with self.subTest(round=rnd):
                os.environ["TORCHELASTIC_RESTART_COUNT"] = rnd
                self.mon.reports.clear()
                ip = self.ip()

                def train(ctx):
                    ctx.step()
                    ctx.step()

                ip.run(train)
                ip.close()
                time.sleep(0.2)  # the fake reads the reports
                with self.mon.lock:
                    got = [(r["round"], r["phase"]) for r in self.mon.reports]
                self.assertEqual(got, want)

    def test_restart_notice_is_not_an_exception(self):
        # A loop's broad "except Exception" must not swallow the notice.
        ip = self.ip()
        swallowed = []

        def train(ctx):
            if ctx.round == 0:
                self.mon.connected.wait(5)
                self.mon.notify(**notice(1))
                while True:
                    try:
                        ctx.step()
                    except Exception as e:  # noqa: BLE001 (what user code does)
                        swallowed.append(e)
                    time.sleep(0.01)
            return ctx.round

        self.assertEqual(ip.run(train), 1)
        ip.close()
        self.assertEqual(swallowed, [])

    def test_timeout_in_seconds(self):
        import datetime

        self.assertEqual(self.ip(timeout=90).timeout, datetime.timedelta(seconds=90))
        self.assertEqual(self.ip(timeout=datetime.timedelta(minutes=2)).timeout, datetime.timedelta(minutes=2))
        self.assertIsNone(self.ip().timeout)

    def test_sections_are_defined_again_in_the_new_session(self):
        # Section ids belong to a monitor session: after a rejoin the
        # client defines them again before using them.
        ip = self.ip()

        def train(ctx):
            ctx.monitor.start_section("step")
            ctx.monitor.end_section("step")
            if ctx.round == 0:
                self.mon.connected.wait(5)
                threading.Timer(0.1, self.mon.notify, kwargs=notice(1)).start()
                raise RuntimeError("peer gone")
            return ctx.round

        self.assertEqual(ip.run(train), 1)
        ip.close()
        self.wait_for(lambda: sum(1 for s in self.mon.sections if s[0] == 1) == 3)
        with self.mon.lock:
            second = [s[1:] for s in self.mon.sections if s[0] == 1]
        self.assertEqual(second, [("define", 0), ("open", 0), ("close", 0)])

    def test_heartbeats_from_another_thread_during_a_rejoin(self):
        # A heartbeat thread keeps running while the API replaces the
        # session: its calls in between are no-ops, never errors. (Socket
        # heartbeats: the fake monitor hands out no shared region.)
        ip = self.ip()
        errors, stop = [], threading.Event()

        def beat():
            while not stop.is_set():
                try:
                    ip.monitor.send_heartbeat()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)
                    return

        beater = threading.Thread(target=beat, daemon=True)

        def train(ctx):
            if ctx.round == 0:
                beater.start()
                self.mon.connected.wait(5)
                time.sleep(0.05)
            if ctx.round < 6:  # rejoin six times while the thread beats
                self.wait_for(lambda: len(self.mon.hellos) == ctx.round + 1)  # the fake has this session
                self.mon.notify(**notice(ctx.round + 1))
                raise RuntimeError("peer gone")
            return ctx.round

        try:
            self.assertEqual(ip.run(train), 6)
        finally:
            stop.set()  # before close: a heartbeat after close() is the caller's error
            if beater.is_alive():
                beater.join(5)
            ip.close()
        self.assertEqual(errors, [])

    def test_without_a_launcher_runs_once(self):
        os.environ.pop(SOCKET_ENV)
        ip = self.ip()
        self.assertEqual(ip.run(lambda ctx: ctx.restarted), False)
        self.assertEqual(len(self.pg.inits), 1)
        with self.assertRaises(RuntimeError):
            ip.run(lambda ctx: (_ for _ in ()).throw(RuntimeError("x")))


class LightningTest(_Fixture):
    """The FaultToleranceCallback inside InProcess.run, with the Lightning
    stand-in (Lightning does not install here)."""

    def _rebuilt_after_rejoin(self, how):
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from standin import Trainer

        from ft_launcher_client.lightning import FaultToleranceCallback

        ip = self.ip()
        fits = []
        steps = []

        def train(ctx):
            cb = FaultToleranceCallback(autoresume=False, calculate_timeouts=False, inprocess=ctx,
                                        exp_dir=self.dir)
            first = not ctx.restarted
            if how == "collective error":  # the fit fails at step 3, the notice follows
                t = Trainer([cb], max_steps=6, fail_at_step=3 if first else None, global_rank=0)
                if first:
                    self.mon.connected.wait(5)
                    threading.Timer(0.1, self.mon.notify, kwargs=notice(1)).start()
            else:  # the notice comes while the fit runs: the callback ends it at a batch's end
                t = Trainer([cb], max_steps=200 if first else 6, batch_sleep=0.01 if first else 0.0,
                            global_rank=0)
                if first:
                    self.mon.connected.wait(5)
                    self.mon.notify(**notice(1))
            fits.append(ctx.round)
            try:
                t.fit()
            finally:
                steps.append(t.global_step)
            return t.global_step

        self.assertEqual(ip.run(train), 6)
        self.assertEqual(fits, [0, 1])
        if how == "notice":
            self.assertLess(steps[0], 200, "the notice did not end the first fit")
        # The callback used the API's sessions: one per round, both registered.
        self.assertEqual([h.get("inprocess") for h in self.mon.hellos], [True, True])
        # The restart is reported complete: rejoined, then the first step
        # (taken in the rebuilt Trainer), so the launcher does not take the
        # next failure for one during this restart.
        self.wait_for(lambda: len(self.mon.reports) == 2)
        ip.close()
        self.assertEqual([(r["phase"], r["round"]) for r in self.mon.reports], [("rejoined", 1), ("first_step", 1)])
        self.assertGreaterEqual(self.mon.reports[1]["first_step_s"], 0)

    def test_trainer_rebuilt_after_rejoin(self):
        for how in ("collective error", "notice"):
            with self.subTest(how=how):
                self.tearDown()
                self.setUp()
                self._rebuilt_after_rejoin(how)


class SnapshotTest(unittest.TestCase):
    def test_copy_semantics(self):
        s = inprocess.Snapshot()
        self.assertFalse(s)
        self.assertEqual(s.load(), (None, None))
        state = {"w": [1, 2]}
        s.save(10, model=state)
        state["w"].append(3)  # later training does not change the copy
        step, got = s.load()
        self.assertEqual((step, got), (10, {"model": {"w": [1, 2]}}))
        got["model"]["w"].append(9)  # nor does the restored copy's use
        self.assertEqual(s.load()[1], {"model": {"w": [1, 2]}})

    def test_load_for_a_step(self):
        # The step the ranks agreed on: a copy of another step is not used.
        s = inprocess.Snapshot()
        self.assertEqual(s.load(8), (None, None))
        s.save(8, model={"w": 1})
        self.assertEqual(s.load(8), (8, {"model": {"w": 1}}))
        self.assertEqual(s.load(4), (None, None))


class FailedInitTest(unittest.TestCase):
    """_init_pg against a stand-in for torch 2.x's torch.distributed (torch
    2.x is not installed here; Debian's 1.13 has no such counter): its
    init_process_group bumps distributed_c10d._world.group_count, which names
    the default group, before the rendezvous, as torch 2.6 does. A failed
    init must leave the counter as it was, or the next init names its group
    "1" where the round's fresh ranks use "0" (their store keys differ, and
    init waits for peers that never come)."""

    def setUp(self):
        import types

        world = types.SimpleNamespace(group_count=0)
        c10d = types.ModuleType("torch.distributed.distributed_c10d")
        c10d._world = world
        dist = types.ModuleType("torch.distributed")
        dist.distributed_c10d = c10d
        self.fail_next = True
        self.names = []

        def init_process_group(backend, init_method, **kw):
            name = str(world.group_count)
            world.group_count += 1
            if self.fail_next:
                raise RuntimeError("failed to recv, got 0 bytes")
            self.names.append(name)
            dist.initialized = True

        dist.init_process_group = init_process_group
        dist.initialized = False
        dist.is_initialized = lambda: dist.initialized
        torch = types.ModuleType("torch")
        torch.distributed = dist
        modules = mock.patch.dict(sys.modules, {"torch": torch, "torch.distributed": dist,
                                                "torch.distributed.distributed_c10d": c10d})
        modules.start()
        self.addCleanup(modules.stop)
        self.world = world

    def test_failed_init_puts_the_group_counter_back(self):
        ip = inprocess.InProcess()
        with self.assertRaises(RuntimeError):
            ip._init_pg()
        self.assertEqual(self.world.group_count, 0)
        self.fail_next = False
        ip._init_pg()
        self.assertEqual(self.names, ["0"])  # the name the round's fresh ranks use
        self.assertEqual(self.world.group_count, 1)


if __name__ == "__main__":
    unittest.main()
