"""Tests of ft_launcher_client.state with real torch tensors.

Run by client/python/state_test.go with Debian's python3 (torch); not named
test_*.py so that the torch-free unittest discovery does not collect it.

It is one file on purpose: every test here needs torch and real tensors,
and the Go side runs it as one process with one import of torch; the
torch-free tests of the state package live in test_state.py and
test_state_package.py.
"""

import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ft_launcher_client import state  # noqa: E402
from ft_launcher_client.state import SHM_DIR_ENV, DIR_ENV  # noqa: E402
from ft_launcher_client.state import copying, files, format as state_format, saving, segment  # noqa: E402


def make_state(step):
    """A training-like state whose every value follows from step."""
    g = torch.Generator().manual_seed(step)
    w = torch.randn(64, 33, generator=g)
    shared = torch.arange(10, dtype=torch.int64) + step
    return {
        "model": {
            "w": w,
            "w_t": w.t(),  # not contiguous
            "b16": torch.randn(17, generator=g).to(torch.bfloat16),
            "half": torch.randn(3, 5, generator=g).half(),
            "f64": torch.randn(4, generator=g, dtype=torch.float64),
            "mask": torch.rand(9, generator=g) > 0.5,
            "scalar": torch.tensor(float(step)),
            "empty": torch.empty(0, 4),
            "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
            "c64": torch.randn(3, generator=g, dtype=torch.complex64),
        },
        "opt": {"state": {0: {"exp_avg": torch.randn(64, 33, generator=g), "step": step}},
                "param_groups": [{"lr": 0.1, "params": [0]}]},
        "shared_a": shared,
        "shared_b": shared,
        "rng": g.get_state(),  # a generator state (uint8 tensor), as checkpoints keep
        "step": step,
        "note": "step %d" % step,
    }


def same(a, b):
    """Bit-identical: the same structure, and tensors of the same dtype,
    shape and bytes (NaN payloads and -0.0 included)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        ac, bc = a.contiguous(), b.contiguous()
        return ac.reshape(-1).view(torch.uint8).equal(bc.reshape(-1).view(torch.uint8)) if ac.numel() else True
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def _section_recorder(calls):
    """A monitor stand-in that records the sections opened and closed."""

    class Mon:
        is_initialized = True

        def start_section(self, name):
            calls.append(("open", name))

        def end_section(self, name):
            calls.append(("close", name))

    return Mon


class Env:
    """A launcher's environment for one rank: a segment directory standing
    for the launcher's (it outlives the saving processes, as the launcher's
    does) and a state directory."""

    def __init__(self, launcher=True):
        self.root = tempfile.mkdtemp(prefix="ftstate-test-")
        self.shm = os.path.join(self.root, "shm")
        self.dir = os.path.join(self.root, "ckpt")
        os.mkdir(self.shm)
        self.env = {"LOCAL_RANK": "0", "RANK": "3", DIR_ENV: self.dir}
        if launcher:
            self.env[SHM_DIR_ENV] = self.shm
        self.patch = mock.patch.dict(os.environ, self.env)

    def __enter__(self):
        os.environ.pop(SHM_DIR_ENV, None)
        self.patch.start()
        return self

    def __exit__(self, *a):
        self.patch.stop()
        shutil.rmtree(self.root)


class StateTest(unittest.TestCase):
    def test_memory_round_trip_bit_identical(self):
        with Env() as e:
            self.assertEqual(state.load(), (None, None))
            for step in (1, 2, 3):
                info = state.save(step, make_state(step))
                self.assertEqual(info["where"], "memory")
                self.assertGreater(info["bytes"], 64 * 33 * 4 * 2)
            self.assertEqual([n for n in os.listdir(e.shm) if not n.startswith("restore-")], ["rank-0"])
            self.assertFalse(os.path.exists(e.dir), "a save into memory wrote files")
            step, got = state.load()
            self.assertEqual(step, 3)
            self.assertTrue(same(got, make_state(3)))
            self.assertIs(got["shared_a"], got["shared_b"], "one tensor saved twice came back as two")
            self.assertTrue(got["model"]["w_t"].is_contiguous())
            # The loaded tensors own their memory: changing them does not
            # change the save.
            got["model"]["w"].zero_()
            self.assertTrue(same(state.load()[1], make_state(3)))

    def test_load_leaves_restore_notes(self):
        # Each load() under a launcher leaves a note of its source for the
        # launcher's store (state_restore events, ft-resumer report).
        with Env() as e:
            with mock.patch.dict(os.environ, {"TORCHELASTIC_RESTART_COUNT": "2"}):
                state.load()
                state.save(5, make_state(5))
                state.load()
            notes = sorted((n for n in os.listdir(e.shm) if n.startswith("restore-")),
                           key=lambda n: int(n.rsplit("-", 1)[1].split(".")[0]))
            self.assertEqual(len(notes), 2, os.listdir(e.shm))
            got = []
            for n in notes:
                with open(os.path.join(e.shm, n)) as f:
                    got.append(json.load(f))
            self.assertEqual([(g["step"], g["source"]) for g in got], [(None, None), (5, "memory")])
            for g in got:
                self.assertEqual((g["local_rank"], g["rank"], g["round"]), (0, 3, 2))
                self.assertGreaterEqual(g["load_ms"], 0)
                self.assertTrue(g["at"].endswith("+00:00"), g["at"])
        with Env(launcher=False):
            state.save(1, make_state(1))
            state.load()  # no launcher: nowhere to leave a note, and no error

    def test_growing_state(self):
        with Env():
            state.save(1, {"x": torch.zeros(10)})
            big = {"x": torch.randn(600_000)}  # 2.4 MB: past the first 1 MiB slot
            state.save(2, big)
            step, got = state.load()
            self.assertEqual(step, 2)
            self.assertTrue(same(got, big))

    def test_checksum_round_trip(self):
        with Env():
            state.save(5, make_state(5), checksum=True)
            step, got = state.load()
            self.assertEqual(step, 5)
            self.assertTrue(same(got, make_state(5)))

    def test_corrupt_save_is_refused(self):
        # The only save damaged: nothing intact to fall back to.
        with Env() as e:
            state.save(1, {"x": torch.ones(1000)})
            path = os.path.join(e.shm, "rank-0")
            with open(path, "r+b") as f:  # flip a payload byte
                f.seek(state.HEADER + 200)
                b = f.read(1)
                f.seek(state.HEADER + 200)
                f.write(bytes([b[0] ^ 0xFF]))
            with self.assertLogs("ft_launcher_client.state", "WARNING"), self.assertWarns(state.CorruptStateWarning):
                with self.assertRaises(state.StateError):
                    state.load()
            # Unchecked, the flipped byte is not noticed: that is what the
            # checksum buys.
            self.assertEqual(state.load(verify=False)[0], 1)

    def test_bit_flip_in_a_tensor_falls_back_to_the_older_save(self):
        # A bit flipped in the newest save's tensor bytes: caught by its
        # CRC (on by default); load() and load(into=...) restore the older
        # save, bit-identical, with a warning. With checksum=False the
        # same flip goes unnoticed (only the structure is checked).
        for checksum in (True, False):
            with self.subTest(checksum=checksum), Env() as e:
                state.save(1, make_state(1), checksum=checksum)
                state.save(2, make_state(2), checksum=checksum)
                path = os.path.join(e.shm, "rank-0")
                fd = os.open(path, os.O_RDONLY)
                try:
                    ds = segment.slots(fd)
                finally:
                    os.close(fd)
                d = ds[segment.newest(ds)]
                with open(path, "r+b") as f:
                    f.seek(d[2] + d[3] - 4000)  # inside the last tensors' bytes
                    b = f.read(1)
                    f.seek(d[2] + d[3] - 4000)
                    f.write(bytes([b[0] ^ 0x04]))
                if not checksum:
                    step, got = state.load()
                    self.assertEqual(step, 2)
                    self.assertFalse(same(got, make_state(2)), "the flip did not land in the state")
                    continue
                with self.assertWarns(state.CorruptStateWarning) as w:
                    step, got = state.load()
                self.assertEqual(step, 1)
                self.assertTrue(same(got, make_state(1)))
                self.assertIn("CRC", str(w.warning))
                into = make_state(7)
                info = {}
                with self.assertWarns(state.CorruptStateWarning):
                    step, got = state.load(into=into, info=info)
                self.assertEqual((step, info["source"]), (1, "memory"))
                self.assertTrue(same(into["model"]["w"], make_state(1)["model"]["w"]), "into= not refilled from the older save")
                self.assertTrue(same(got, make_state(1)))

    def test_fallback_without_launcher(self):
        with Env(launcher=False) as e:
            self.assertEqual(state.load(), (None, None))
            info = state.save(7, make_state(7))
            self.assertEqual(info["where"], "file")
            first = sorted(os.listdir(e.dir))
            self.assertEqual(first, ["rank-3-own-1.ftstate", "rank-3.json"])
            state.save(8, make_state(8))
            self.assertEqual(sorted(os.listdir(e.dir)), ["rank-3-own-2.ftstate", "rank-3.json"])
            step, got = state.load()
            self.assertEqual(step, 8)
            self.assertTrue(same(got, make_state(8)))
            for p in (e.dir, os.path.join(e.dir, "rank-3.json"), os.path.join(e.dir, "rank-3-own-2.ftstate")):
                step, got = state.load_file(p)
                self.assertEqual(step, 8)
                self.assertTrue(same(got, make_state(8)))
            with self.assertRaises(FileNotFoundError):
                state.load_file(e.dir, rank=9)

    def test_no_room_in_memory_falls_back_to_file(self):
        with Env() as e:
            state.save(1, {"x": torch.ones(10)})  # fits: memory
            saving.warned_no_room[0] = False  # warned once per process
            with mock.patch.object(segment, "mem_available", return_value=1 << 20):
                with self.assertLogs("ft_launcher_client.state", "WARNING") as logs:
                    info = state.save(2, {"x": torch.ones(1_000_000)})
            self.assertEqual(info["where"], "file")
            self.assertIn("MemAvailable", "".join(logs.output))
            step, got = state.load()  # the file holds the newer step
            self.assertEqual(step, 2)
            self.assertTrue(same(got, {"x": torch.ones(1_000_000)}))
            self.assertTrue(os.path.exists(os.path.join(e.dir, "rank-3.json")))

    def test_save_counts_as_checkpoint_section(self):
        calls = []
        Mon = _section_recorder(calls)

        with Env():
            state.Bound(lambda: Mon()).save(1, {"x": torch.ones(3)})
        self.assertEqual(calls, [("open", "checkpointing"), ("close", "checkpointing")])

    def test_saver_killed_mid_save_leaves_last_commit(self):
        """A real process saving in a loop is SIGKILLed; the segment then
        holds a whole save of some step, never a mix."""
        with Env() as e:
            code = (
                "import sys, torch; sys.path.insert(0, %r)\n"
                "from ft_launcher_client import state\n"
                "for step in range(1, 1000000):\n"
                "    state.save(step, {'w': torch.full((2_000_000,), float(step)), 'step': step})\n"
                "    if step == 2: print('saving', flush=True)\n"
            ) % os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
            env = dict(os.environ)
            p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
            try:
                self.assertEqual(p.stdout.readline().strip(), b"saving")
                time.sleep(0.7)
                p.send_signal(signal.SIGKILL)
            finally:
                p.wait()
                p.stdout.close()
            self.assertEqual(p.returncode, -signal.SIGKILL)
            step, got = state.load()
            self.assertGreaterEqual(step, 2)
            self.assertEqual(got["step"], step)
            self.assertTrue(torch.equal(got["w"], torch.full((2_000_000,), float(step))))
            # The next process of the rank saves over the debris.
            state.save(step + 1, {"w": torch.zeros(5), "step": step + 1})
            self.assertEqual(state.load()[0], step + 1)
            self.assertEqual([n for n in os.listdir(e.shm) if not n.endswith(".grow") and not n.startswith("restore-")], ["rank-0"])

    def test_many_saves_through_the_mapping(self):
        # From the third save on, a slot is written by memcpy into this
        # process's mapping of the segment (the first save of each slot
        # here uses pwrite): every save must still read back whole.
        with Env():
            for step in range(1, 9):
                state.save(step, make_state(step))
                got_step, got = state.load()
                self.assertEqual(got_step, step)
                self.assertTrue(same(got, make_state(step)), "step %d" % step)
            # A bigger state re-creates the segment; the mapping follows.
            big = {"x": torch.randn(700_000), "step": 9}
            state.save(9, big)
            state.save(10, dict(big, step=10))
            state.save(11, dict(big, step=11))
            self.assertTrue(same(state.load()[1], dict(big, step=11)))

    def test_load_into_model_and_optimizer_in_place(self):
        with Env():
            torch.manual_seed(0)

            def build():
                m = torch.nn.Sequential(torch.nn.Linear(12, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3))
                return m, torch.optim.Adam(m.parameters(), lr=0.01)

            def train(m, opt, n):
                for i in range(n):
                    opt.zero_grad()
                    m(torch.randn(5, 12, generator=torch.Generator().manual_seed(i))).square().mean().backward()
                    opt.step()

            m, opt = build()
            train(m, opt, 3)
            opt.param_groups[0]["lr"] = 0.005  # a scheduler's change comes back too
            state.save(3, {"model": m.state_dict(), "opt": opt.state_dict(), "step": 3})
            want_m = {k: v.clone() for k, v in m.state_dict().items()}
            want_o = {k: {kk: vv.clone() if torch.is_tensor(vv) else vv for kk, vv in v.items()}
                      for k, v in opt.state_dict()["state"].items()}

            # A fresh process: the model exists, the optimizer has no state
            # yet (it is loaded by its own load_state_dict).
            m2, opt2 = build()
            ptrs = {k: v.data_ptr() for k, v in m2.state_dict().items()}
            step, got = state.load(into={"model": m2, "opt": opt2})
            self.assertEqual((step, got["step"]), (3, 3))
            self.assertTrue(same(m2.state_dict(), want_m))
            self.assertEqual({k: v.data_ptr() for k, v in m2.state_dict().items()}, ptrs, "model tensors were replaced")
            self.assertTrue(same(opt2.state_dict()["state"], want_o))
            self.assertEqual(opt2.param_groups[0]["lr"], 0.005)
            for k, v in got["model"].items():
                self.assertEqual(v.data_ptr(), ptrs[k], "the state returned does not hold the model's tensors")

            # An optimizer that has state: filled in place too.
            train(m2, opt2, 1)
            opt2.param_groups[0]["lr"] = 1.0
            optptrs = {(pid, k): v.data_ptr() for pid, st in opt2.state_dict()["state"].items()
                       for k, v in st.items() if torch.is_tensor(v)}
            state.load(into={"model": m2, "opt": opt2})
            self.assertTrue(same(m2.state_dict(), want_m))
            self.assertTrue(same(opt2.state_dict()["state"], want_o))
            self.assertEqual(opt2.param_groups[0]["lr"], 0.005)
            self.assertEqual({(pid, k): v.data_ptr() for pid, st in opt2.state_dict()["state"].items()
                              for k, v in st.items() if torch.is_tensor(v)}, optptrs)
            # Training on from the restored state matches training on from
            # the original.
            train(m, opt, 2)
            train(m2, opt2, 2)
            self.assertTrue(same(m.state_dict(), m2.state_dict()))

    def test_load_into_plain_tensors(self):
        with Env() as e:
            s = make_state(4)
            state.save(4, s)
            into = {"model": {"w": torch.zeros(64, 33), "w_t": torch.zeros(64, 33).t(),  # not contiguous
                              "b16": torch.zeros(17, dtype=torch.bfloat16)},
                    "shared_a": torch.zeros(10, dtype=torch.int64), "shared_b": torch.zeros(10, dtype=torch.int64),
                    "step": "ignored: non-tensor values come from the save"}
            step, got = state.load(into=into)
            self.assertTrue(same(got, s))
            for k in ("w", "w_t", "b16"):
                self.assertIs(got["model"][k], into["model"][k])
                self.assertTrue(same(into["model"][k], s["model"][k]), k)
            self.assertTrue(same(into["shared_b"], s["shared_b"]))
            self.assertTrue(same(into["shared_a"], s["shared_a"]))
            self.assertEqual(got["step"], 4)
            # The written-out file takes into= as well.
            state.save(5, make_state(5))
            fdir = os.path.join(e.root, "files")
            with mock.patch.dict(os.environ, {SHM_DIR_ENV: ""}):
                os.environ.pop(SHM_DIR_ENV)
                state.save(5, make_state(5), path=fdir)
                w = torch.zeros(64, 33)
                step, got = state.load_file(fdir, into={"model": {"w": w}})
            self.assertEqual(step, 5)
            self.assertIs(got["model"]["w"], w)
            self.assertTrue(same(w, make_state(5)["model"]["w"]))

    def test_load_into_mismatch_is_a_clear_error_and_writes_nothing(self):
        with Env():
            state.save(1, {"model": torch.nn.Linear(4, 3).state_dict(), "step": 1})
            cases = [
                ({"model": {"weight": torch.zeros(3, 5), "bias": torch.zeros(3)}}, "saved float32 [3, 4], into has float32 [3, 5]"),
                ({"model": {"weight": torch.zeros(3, 4, dtype=torch.float64)}}, "into has float64 [3, 4]"),
                ({"model": {"weight": torch.zeros(3, 4), "scale": torch.zeros(1)}}, "['model']['scale'] is not in the save"),
                ({"model": torch.nn.Linear(4, 2)}, "into has float32 [2, 4]"),
                ({"model": torch.nn.Linear(4, 3, bias=False)}, "does not match the save"),
                ({"model": [torch.zeros(3)]}, "into holds a list"),
                ({"step": torch.zeros(1)}, "into holds a tensor at ['step'], the save a int"),
            ]
            for into, msg in cases:
                before = [t.clone() for t in _tensors(into)]
                with self.assertRaises(state.StateError) as cm:
                    state.load(into=into)
                self.assertIn(msg, str(cm.exception))
                for a, b in zip(before, _tensors(into)):
                    self.assertTrue(same(a, b), "a refused load(into=) wrote into a tensor: %s" % msg)

    def test_reader_racing_writer(self):
        """A process saves back to back (every tensor of save N holds N,
        each save about as long as a load) while this one loads, into new
        tensors and into=: each load returns one whole save, never a mix of
        two, or, when the saver overwrote the slot during 8 reads in a row,
        refuses with a StateError saying so."""
        with Env():
            n = 1_000_000
            code = (
                "import sys, torch; sys.path.insert(0, %r)\n"
                "from ft_launcher_client import state\n"
                "a, b = torch.empty(%d), torch.empty(%d, dtype=torch.float64)\n"
                "for step in range(1, 100000):\n"
                "    a.fill_(step); b.fill_(step)\n"
                "    state.save(step, {'a': a, 'b': b, 'step': step})\n"
                "    if step == 3: print('saving', flush=True)\n"
            ) % (os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), n, n // 2)
            p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
            try:
                self.assertEqual(p.stdout.readline().strip(), b"saving")
                into = {"a": torch.empty(n), "b": torch.empty(n // 2, dtype=torch.float64)}
                steps, deadline, refused = set(), time.monotonic() + 4, 0
                while time.monotonic() < deadline or len(steps) < 3:
                    self.assertIsNone(p.poll(), "the saver exited")
                    for kw in ({}, {"into": into}):
                        try:
                            step, got = state.load(**kw)
                        except state.StateError as e:
                            self.assertIn("overwritten 8 times while being read", str(e))
                            refused += 1
                            continue
                        self.assertEqual(got["step"], step)
                        for k in ("a", "b"):
                            lo, hi = got[k].min().item(), got[k].max().item()
                            self.assertEqual((lo, hi), (step, step), "load %r: tensor %s mixes saves" % (kw.keys(), k))
                        steps.add(step)
                    if time.monotonic() > deadline + 30:
                        break
                self.assertGreaterEqual(len(steps), 3, "the loads did not see the saver move on (%d refused)" % refused)
            finally:
                p.kill()
                p.wait()
                p.stdout.close()


def _payload(shm):
    """The newest committed save's payload bytes in the segment of Env."""
    with open(os.path.join(shm, "rank-0"), "rb") as f:
        fd = f.fileno()
        ds = segment.slots(fd)
        d = ds[segment.newest(ds)]
        return os.pread(fd, d[3], d[2])


def odd_state(step):
    """Sizes that do not fall on chunk bounds: odd lengths, many small
    tensors, empty ones, a non-contiguous one, one tensor larger than a
    chunk, 1-byte elements."""
    g = torch.Generator().manual_seed(step)
    s = make_state(step)
    s["big"] = torch.randn(12_345, generator=g, dtype=torch.float64)
    s["many"] = [torch.randn(i % 7 + 1, generator=g) for i in range(150)]
    s["empty"] = [torch.empty(0), torch.empty(3, 0, dtype=torch.int16)]
    s["odd_u8"] = torch.randint(0, 255, (4_099,), generator=g, dtype=torch.uint8)
    s["strided"] = torch.randn(101, 37, generator=g)[::3, 1::2]
    return s


class Evil:
    """A pickle that runs a command when loaded (its __reduce__)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch %s" % self.marker,))


class RunConfig:
    """A user's own class kept in the state: refused unless trusted."""

    def __init__(self, lr):
        self.lr = lr


class UnpicklerTest(unittest.TestCase):
    """A load never runs what a state names unless it is plain training
    data or the caller trusted it (docs/state.md, "What a load executes")."""

    def test_real_model_and_optimizer_state_loads_without_opt_in(self):
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.LSTM(4, 4))
        opts = [torch.optim.Adam(m.parameters()), torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)]
        m[1](m[0](torch.randn(3, 4))).sum().backward()
        for o in opts:
            o.step()
        sched = torch.optim.lr_scheduler.StepLR(opts[0], 10)
        st = {"model": m.state_dict(), "opt": [o.state_dict() for o in opts], "sched": sched.state_dict(),
              "rng": torch.get_rng_state(), "shape": torch.Size([3, 4]), "dtype": torch.bfloat16,
              "dev": torch.device("cpu"), "misc": (1, 2.5, "s", b"b", None, {1, 2}, frozenset([3]), complex(1, 2))}
        try:
            import numpy
            st["np_rng"] = numpy.random.get_state()
        except ImportError:
            pass
        with Env():
            state.save(1, st)
            step, got = state.load()
            self.assertEqual(step, 1)
            self.assertEqual(list(got["model"].keys()), list(m.state_dict().keys()))
            self.assertEqual(got["shape"], torch.Size([3, 4]))
            self.assertIs(got["dtype"], torch.bfloat16)
            self.assertEqual(got["sched"], sched.state_dict())

    def test_malicious_reduce_is_refused_and_never_runs(self):
        with Env() as e:
            marker = os.path.join(e.root, "pwned")
            state.save(1, {"model": {"w": torch.ones(2)}, "evil": Evil(marker)})
            self.assertFalse(os.path.exists(marker), "saving ran it")
            with self.assertRaises(state.UntrustedClassError) as cm:
                state.load()
            msg = str(cm.exception)
            self.assertIn("system", msg)
            self.assertIn("trusted_classes", msg)
            self.assertIn(state.TRUSTED_CLASSES_ENV, msg)
            self.assertFalse(os.path.exists(marker), "a load from memory ran the state's __reduce__")
        # The same from a written-out file.
        with Env(launcher=False) as e:
            marker = os.path.join(e.root, "pwned")
            state.save(2, {"evil": Evil(marker)})
            with self.assertRaises(state.UntrustedClassError):
                state.load_file(e.dir)
            with self.assertRaises(state.UntrustedClassError):
                state.load()
            self.assertFalse(os.path.exists(marker), "a load from a file ran the state's __reduce__")

    def test_opt_in_admits_a_custom_class(self):
        with Env():
            state.save(1, {"cfg": RunConfig(0.5), "w": torch.ones(3)})
            with self.assertRaises(state.UntrustedClassError) as cm:
                state.load()
            self.assertIn("RunConfig", str(cm.exception))
            for trusted in ([RunConfig], [RunConfig.__module__ + ".RunConfig"]):
                step, got = state.load(trusted_classes=trusted)
                self.assertIsInstance(got["cfg"], RunConfig)
                self.assertEqual(got["cfg"].lr, 0.5)
            with mock.patch.dict(os.environ, {state.TRUSTED_CLASSES_ENV: RunConfig.__module__ + ":RunConfig"}):
                self.assertEqual(state.load()[1]["cfg"].lr, 0.5)
            # Trusting one class does not trust another.
            with self.assertRaises(state.UntrustedClassError):
                state_format.Unpickler(io.BytesIO(pickle.dumps(Evil("/nonexistent/x"))), None, [RunConfig]).load()
            with self.assertRaises(state.StateError):
                state.load(trusted_classes=["nodot"])


class ParallelCopyTest(unittest.TestCase):
    """save and load split their copies across FT_STATE_COPY_THREADS
    threads (copying.spread); chunks are made small and odd here (at least
    1,000 bytes, no alignment) so that every path splits tensors in odd
    places."""

    def setUp(self):
        p = mock.patch.multiple(copying, MIN_CHUNK=1000, CHUNK_ALIGN=1)
        p.start()
        self.addCleanup(p.stop)

    def threads(self, n):
        return mock.patch.dict(os.environ, {state.COPY_THREADS_ENV: str(n)})

    def test_parallel_copy_is_bit_identical_to_one_thread(self):
        want = odd_state(3)
        payloads = {}
        for n in (1, 2, 3, 7):
            # A fresh segment each time: the first save grows it (pwrite
            # into a new file), the second is the first of its other slot
            # (pwrite), the third on go through the mapping (memcpy).
            with Env() as e, self.threads(n):
                seen = set()
                real = copying.memmove

                def spy(d, s, k):
                    seen.add(threading.current_thread().name.split("_")[0])
                    real(d, s, k)

                with mock.patch.object(copying, "memmove", spy):
                    for step in (1, 2, 3, 4):
                        info = state.save(step, odd_state(3))
                        self.assertEqual((info["where"], info["threads"]), ("memory", n))
                        payloads.setdefault((n, step), _payload(e.shm))
                        for m in (1, n):
                            with self.threads(m):
                                got_step, got = state.load()
                                self.assertEqual(got_step, step)
                                self.assertTrue(same(got, want), "save threads %d, load threads %d, step %d" % (n, m, step))
                                into = {"model": {"w": torch.zeros(64, 33), "w_t": torch.zeros(64, 33).t()},
                                        "big": torch.zeros(12_345, dtype=torch.float64),
                                        "many": [torch.zeros(i % 7 + 1) for i in range(150)],
                                        "strided": torch.zeros(34, 18)}
                                _, got = state.load(into=into)
                                self.assertTrue(same(got, want))
                                self.assertIs(got["big"], into["big"])
                                self.assertTrue(same(into["many"], want["many"]))
                if n > 1:
                    self.assertIn("ftstate-copy", seen, "no copy ran on a pool thread")
        for (n, step), p in payloads.items():
            self.assertEqual(p, payloads[(1, step)], "payload of step %d with %d threads differs from 1 thread" % (step, n))

    def test_parallel_file_save_and_load(self):
        with Env(launcher=False) as e, self.threads(3):
            state.save(2, odd_state(2))
            step, got = state.load_file(e.dir)
            self.assertEqual(step, 2)
            self.assertTrue(same(got, odd_state(2)))
            big = torch.zeros(12_345, dtype=torch.float64)
            _, got = state.load_file(e.dir, into={"big": big})
            self.assertIs(got["big"], big)
            self.assertTrue(same(big, odd_state(2)["big"]))

    def test_checksum_with_threads(self):
        with Env() as e, self.threads(4):
            for step in (1, 2, 3):
                state.save(step, odd_state(step), checksum=True)
            self.assertTrue(same(state.load()[1], odd_state(3)))
            # A flipped byte in the middle of a tensor is caught.
            with open(os.path.join(e.shm, "rank-0"), "r+b") as f:
                ds = segment.slots(f.fileno())
                d = ds[segment.newest(ds)]
                at = d[2] + d[3] - 5000
                b = os.pread(f.fileno(), 1, at)
                os.pwrite(f.fileno(), bytes([b[0] ^ 1]), at)
            # Caught (the CRC computed on 4 threads, combined), and the
            # older save restored instead.
            with self.assertWarns(state.CorruptStateWarning):
                step, got = state.load()
            self.assertEqual(step, 2)
            self.assertTrue(same(got, odd_state(2)))

    def test_a_failing_copy_thread_leaves_the_previous_save(self):
        """An exception in a copy thread fails the save, every path (a new
        segment grown, a slot's first pwrite, the mapping's memcpy); the
        newest committed save stays the one before, whole."""

        def failing(real):
            def f(*a):
                if threading.current_thread() is not threading.main_thread():
                    raise OSError(5, "injected copy failure")
                return real(*a)
            return f

        with Env() as e, self.threads(3):
            pw = mock.patch.object(copying, "pwrite_all", failing(copying.pwrite_all))
            mm = mock.patch.object(copying, "memmove", failing(copying.memmove))
            with pw, self.assertRaisesRegex(OSError, "injected"):
                state.save(1, odd_state(1))  # grows a new segment
            self.assertEqual(state.load(), (None, None))
            state.save(1, odd_state(1))
            with pw, self.assertRaisesRegex(OSError, "injected"):
                state.save(2, odd_state(2))  # the other slot's first save: pwrite
            step, got = state.load()
            self.assertEqual(step, 1)
            self.assertTrue(same(got, odd_state(1)))
            state.save(2, odd_state(2))
            state.save(3, odd_state(3))
            with mm, self.assertRaisesRegex(OSError, "injected"):
                state.save(4, odd_state(4))  # through the mapping
            step, got = state.load()
            self.assertEqual(step, 3)
            self.assertTrue(same(got, odd_state(3)))
            with pw, self.assertRaisesRegex(OSError, "injected"):
                state.save(5, {"x": torch.randn(800_000)})  # a larger segment
            self.assertEqual(state.load()[0], 3)
            self.assertEqual([n for n in os.listdir(e.shm) if not n.startswith("restore-")], ["rank-0"])
            state.save(6, odd_state(6))
            self.assertTrue(same(state.load()[1], odd_state(6)))

    def test_copy_threads_setting(self):
        cases = [  # (FT_STATE_COPY_THREADS, LOCAL_WORLD_SIZE, CPUs, want or the error's text)
            ("", "4", 16, 4),
            ("auto", "1", 16, 8),  # capped
            (" auto ", "", 3, 3),
            (None, "32", 16, 1),
            ("1", "1", 16, 1),
            ("12", "4", 2, 12),
            ("64", "1", 2, 64),
            ("0", "1", 2, "want a whole number from 1 to 64, or auto"),
            ("65", "1", 2, "FT_STATE_COPY_THREADS='65'"),
            ("-2", "1", 2, "from 1 to 64"),
            ("two", "1", 2, "FT_STATE_COPY_THREADS='two'"),
            ("1.5", "1", 2, "from 1 to 64"),
        ]
        for v, lws, cpus, want in cases:
            env = {"LOCAL_WORLD_SIZE": lws}
            if v is not None:
                env[state.COPY_THREADS_ENV] = v
            with mock.patch.dict(os.environ, env), mock.patch.object(os, "sched_getaffinity", lambda _: set(range(cpus))):
                if v is None:
                    os.environ.pop(state.COPY_THREADS_ENV, None)
                if isinstance(want, int):
                    self.assertEqual(state.copy_threads(), want, (v, lws, cpus))
                else:
                    with self.assertRaises(state.StateError) as cm:
                        state.copy_threads()
                    self.assertIn(want, str(cm.exception))
        # A bad value fails the save before it writes anything.
        with Env():
            state.save(1, {"x": torch.ones(3)})
            with mock.patch.dict(os.environ, {state.COPY_THREADS_ENV: "many"}):
                with self.assertRaisesRegex(state.StateError, "FT_STATE_COPY_THREADS"):
                    state.save(2, {"x": torch.ones(3)})
            self.assertEqual(state.load()[0], 1)


class OverlapTest(unittest.TestCase):
    """save(overlap=True): the copy runs in the background until wait()."""

    def gate(self):
        """Patch the copy so that the first chunk blocks until released:
        (started, release) events."""
        started, release = threading.Event(), threading.Event()
        real = copying.memmove

        def slow(d, s, n):
            if not started.is_set():
                started.set()
                self.assertTrue(release.wait(30), "never released")
            real(d, s, n)

        p = mock.patch.object(copying, "memmove", slow)
        p.start()
        self.addCleanup(p.stop)
        self.addCleanup(release.set)
        return started, release

    def test_overlapped_save_commits_and_wait(self):
        with Env():
            self.assertIsNone(state.wait())
            for step in (1, 2, 3):
                info = state.save(step, make_state(step), overlap=True)
                self.assertEqual(info["where"], "pending")
                w = state.wait()
                self.assertEqual((w["step"], w["where"], w["committed"]), (step, "memory", True))
                self.assertAlmostEqual(w["seconds"], w["call_seconds"] + w["wait_seconds"], places=6)
                self.assertGreaterEqual(w["copy_seconds"], 0)
                self.assertIsNone(state.wait(), "a second wait found a save")
                self.assertTrue(same(state.load()[1], make_state(step)))
            # load, the next save and heal wait by themselves.
            state.save(4, make_state(4), overlap=True)
            self.assertEqual(state.load()[0], 4)
            state.save(5, make_state(5), overlap=True)
            state.save(6, make_state(6), overlap=True)
            self.assertEqual(state.wait()["step"], 6)
            self.assertTrue(same(state.load()[1], make_state(6)))
        with Env(launcher=False):
            state.save(7, make_state(7), overlap=True)
            self.assertEqual(state.wait()["where"], "file")
            self.assertTrue(same(state.load()[1], make_state(7)))

    def test_stall_recorded_is_call_plus_wait_and_the_rank_at_the_call(self):
        with Env() as e:
            for step in (1, 2, 3):
                state.save(step, make_state(step))
            started, release = self.gate()
            state.save(4, make_state(4), overlap=True)
            self.assertTrue(started.wait(30))
            # An in-process rejoin renumbers the rank meanwhile: the save
            # stays the old rank's, in the segment chosen at the call.
            with mock.patch.dict(os.environ, {"RANK": "9", "LOCAL_RANK": "1"}):
                threading.Timer(0.3, release.set).start()
                w = state.wait()  # blocks about 0.3 s
            self.assertTrue(w["committed"])
            self.assertGreaterEqual(w["wait_seconds"], 0.25)
            with open(os.path.join(e.shm, "rank-0"), "rb") as f:
                ds = segment.slots(f.fileno())
                d = ds[segment.newest(ds)]
            self.assertEqual((d[1], d[6]), (4, 3))
            recorded = d[5] / 1e9  # the descriptor's stall, which the launcher reports
            self.assertGreaterEqual(recorded, 0.25)
            self.assertLessEqual(recorded, w["seconds"] + 0.01)

    def test_in_place_change_during_the_copy_is_not_committed(self):
        with Env():
            s = make_state(1)
            for step in (1, 2, 3):
                state.save(step, s)
            saving.overlap_refused[0] = 0
            started, release = self.gate()
            s = make_state(4)
            state.save(4, s, overlap=True)
            self.assertTrue(started.wait(30))
            s["opt"]["state"][0]["exp_avg"].add_(1)  # what optimizer.step() does
            with self.assertLogs("ft_launcher_client.state", "WARNING") as logs:
                release.set()
                w = state.wait()
            self.assertFalse(w["committed"])
            self.assertIsNone(w["where"])
            self.assertEqual(w["modified"], "['opt']['state'][0]['exp_avg']")
            self.assertIn("step 4 was not committed", "".join(logs.output))
            self.assertIn("['opt']['state'][0]['exp_avg']", "".join(logs.output))
            step, got = state.load()
            self.assertEqual(step, 3)
            self.assertTrue(same(got, make_state(1)))
            # Changed again: refused again, counted, logged below WARNING.
            started.clear()
            release.clear()
            state.save(5, s, overlap=True)
            self.assertTrue(started.wait(30))
            s["model"]["w"].mul_(2)
            with self.assertNoLogs("ft_launcher_client.state", "WARNING"):
                release.set()
                w = state.wait()
            self.assertEqual((w["committed"], w["modified"]), (False, "['model']['w']"))
            self.assertEqual(saving.overlap_refused[0], 2)
            self.assertEqual(state.load()[0], 3)
            # A non-contiguous tensor is copied to contiguous memory in the
            # call: a change after it cannot tear the save, which commits
            # the value at the call; a view of a saved tensor moves that
            # tensor's version counter.
            for change, want in ((lambda: s["model"]["w_t"].mul_(2), "['model']['w']"), (lambda: s["nc"].zero_(), None)):
                started.clear()
                release.clear()
                s["nc"] = torch.arange(12.0).reshape(3, 4)[:, ::2]
                state.save(6, s, overlap=True)
                self.assertTrue(started.wait(30))
                change()
                release.set()
                w = state.wait()
                self.assertEqual(w.get("modified"), want)
            self.assertEqual(state.load()[1]["nc"].tolist(), [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]])
            # Left alone during the copy: committed.
            state.save(6, s, overlap=True)
            self.assertTrue(state.wait()["committed"])
            self.assertTrue(same(state.load()[1], s))

    def test_in_place_change_refused_in_the_file_fallback(self):
        with Env(launcher=False) as e:
            state.save(1, {"w": torch.ones(100)})
            started, release = threading.Event(), threading.Event()
            real = files.pwrite_bufs

            def slow(fd, bufs, off):
                started.set()
                self.assertTrue(release.wait(30))
                real(fd, bufs, off)

            w = torch.zeros(100)
            with mock.patch.object(files, "pwrite_bufs", slow):
                state.save(2, {"w": w}, overlap=True)
                self.assertTrue(started.wait(30))
                w.add_(3)
                release.set()
                got = state.wait()
            self.assertEqual((got["committed"], got["modified"]), (False, "['w']"))
            self.assertEqual(state.load()[0], 1)
            self.assertEqual(sorted(n for n in os.listdir(e.dir) if not n.startswith(".")), ["rank-3-own-1.ftstate", "rank-3.json"])

    def test_a_failed_overlapped_save_raises_in_wait(self):
        with Env():
            for step in (1, 2, 3):
                state.save(step, make_state(step))

            def broken(d, s, n):
                raise OSError(5, "injected copy failure")

            with mock.patch.object(copying, "memmove", broken):
                state.save(4, make_state(4), overlap=True)
                with self.assertRaisesRegex(OSError, "injected"):
                    state.wait()
            self.assertIsNone(state.wait())
            self.assertEqual(state.load()[0], 3)

    def test_close_and_rejoin_let_the_save_in_flight_finish(self):
        # InProcess.close() and an in-process rejoin call _wait_state()
        # first: the save in flight commits under the old session and rank.
        import types
        from ft_launcher_client import inprocess

        with Env():
            for step in (1, 2, 3):  # both slots written: later saves copy with copying.memmove
                state.save(step, make_state(step))
            real, gate, slowed = copying.memmove, threading.Event(), []

            def slow(d, s, n):
                slowed.append(n)
                gate.wait(10)
                return real(d, s, n)

            ended = []
            fake = types.SimpleNamespace(_reader=None, monitor=types.SimpleNamespace(
                shutdown_workload_monitoring=lambda: ended.append(saving.pending[0] is None)))
            with mock.patch.object(copying, "memmove", slow):
                state.save(4, make_state(4), overlap=True)
                self.assertIsNotNone(saving.pending[0])
                timer = threading.Timer(0.2, gate.set)
                timer.start()
                inprocess.InProcess.close(fake)
                timer.join()
            self.assertTrue(slowed, "the save in flight did not copy through copying.memmove: the test proves nothing")
            self.assertEqual(ended, [True], "the monitor session ended before the save in flight finished")
            self.assertEqual(state.load()[0], 4)

            def broken(d, s, n):
                raise OSError(5, "injected copy failure")

            with mock.patch.object(copying, "memmove", broken):
                state.save(5, make_state(5), overlap=True)
                with self.assertLogs("ft_launcher_client.inprocess", level="WARNING") as logs:
                    inprocess._wait_state()  # a failed save is logged, not raised: the rank goes on
            self.assertIn("injected copy failure", "\n".join(logs.output))
            self.assertIsNone(saving.pending[0])
            self.assertEqual(state.load()[0], 4)

    def test_bound_overlap_and_checkpoint_section(self):
        calls = []
        Mon = _section_recorder(calls)

        with Env():
            b = state.Bound(lambda: Mon())
            self.assertEqual(b.save(1, {"x": torch.ones(3)}, overlap=True)["where"], "pending")
            self.assertEqual(calls, [("open", "checkpointing"), ("close", "checkpointing")])
            self.assertTrue(b.wait()["committed"])
            self.assertEqual(b.load()[0], 1)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return list(obj.state_dict().values())
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


if __name__ == "__main__":
    unittest.main()
