"""Tests of ft_launcher_client.lightning.FaultToleranceCallback against the
Lightning stand-in (standin.Trainer): Lightning does not install here. Run
with `python3 -m unittest discover -s client/python/tests`; the Go test
client/python/lightning_test.go runs them and the callback under a real
ft-launcher."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from standin import Trainer  # noqa: E402

from ft_launcher_client.lightning import FaultToleranceCallback  # noqa: E402

FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"


class CallbackTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.flag = os.path.join(self.dir, "finished.flag")
        self.env = {k: os.environ.get(k) for k in (FLAG_ENV, "FT_RANK_MONITOR_IPC_SOCKET", "RANK")}
        os.environ[FLAG_ENV] = self.flag
        os.environ.pop("FT_RANK_MONITOR_IPC_SOCKET", None)  # no launcher: the client is a no-op
        os.environ.pop("RANK", None)

    def tearDown(self):
        for k, v in self.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def cb(self, **kw):
        kw.setdefault("autoresume", True)
        kw.setdefault("calculate_timeouts", True)
        return FaultToleranceCallback(exp_dir=self.dir, **kw)

    def test_lightning_is_imported_lazily(self):
        code = ("import sys, ft_launcher_client\n"
                "assert 'ft_launcher_client.lightning' not in sys.modules\n"
                "from ft_launcher_client import FaultToleranceCallback\n"
                "assert 'ft_launcher_client.lightning' in sys.modules\n"
                "FaultToleranceCallback(autoresume=False, calculate_timeouts=False)\n")
        subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))

    def test_nvrx_signature(self):
        cb = FaultToleranceCallback(True, False, None, self.dir, "x")
        self.assertEqual((cb.autoresume, cb.calculate_timeouts, cb.exp_dir), (True, False, self.dir))

    def test_autoresume_needs_the_flag_variable(self):
        del os.environ[FLAG_ENV]
        with self.assertRaisesRegex(RuntimeError, FLAG_ENV):
            Trainer([self.cb()], max_steps=2).fit()
        Trainer([self.cb(autoresume=False)], max_steps=2).fit()  # fine without autoresume

    def test_flag_when_max_steps_reached_on_a_single_device(self):
        t = Trainer([self.cb()], max_steps=5)  # no global_rank, no RANK, no process group
        t.fit()
        self.assertEqual(t.global_step, 5)
        self.assertTrue(os.path.exists(self.flag))

    def test_flag_when_max_epochs_reached(self):
        t = Trainer([self.cb()], max_epochs=2, global_rank=0)
        t.fit()
        self.assertEqual(t.current_epoch, 2)
        self.assertTrue(os.path.exists(self.flag))

    def test_no_flag_when_stopped_early(self):
        ckpt = os.path.join(self.dir, "ckpt.json")
        Trainer([self.cb()], max_steps=10, stop_after_steps=3).fit(ckpt_path=ckpt)
        self.assertFalse(os.path.exists(self.flag), "stopped at step 3 of 10: not finished")
        t = Trainer([self.cb()], max_steps=10)
        t.fit(ckpt_path=ckpt)  # the next job resumes and finishes
        self.assertEqual(t.global_step, 10)
        self.assertTrue(os.path.exists(self.flag))

    def test_no_flag_after_a_failure(self):
        with self.assertRaises(RuntimeError):
            Trainer([self.cb()], max_steps=4, fail_at_step=3).fit()
        self.assertFalse(os.path.exists(self.flag))
        # A failure at the last step with teardown still called (older
        # Lightning) must not create it either.
        cb = self.cb()
        t = Trainer([cb], max_steps=4)
        t.fit()
        os.remove(self.flag)
        cb.on_exception(t, None, RuntimeError("boom"))
        cb.setup(t, None, "fit")
        cb.teardown(t, None, "fit")
        self.assertFalse(os.path.exists(self.flag))

    def test_clean_system_exit_is_not_a_failure(self):
        cb = self.cb()
        t = Trainer([cb], max_steps=2)
        t.fit()
        os.remove(self.flag)
        cb.on_exception(t, None, SystemExit(0))
        cb.setup(t, None, "fit")
        cb.teardown(t, None, "fit")
        self.assertTrue(os.path.exists(self.flag))

    def test_only_rank_zero_writes_the_flag(self):
        Trainer([self.cb()], max_steps=3, global_rank=1).fit()
        self.assertFalse(os.path.exists(self.flag))
        os.environ["RANK"] = "2"  # no trainer.global_rank: $RANK decides
        Trainer([self.cb()], max_steps=3).fit()
        self.assertFalse(os.path.exists(self.flag))

    def test_other_stages_are_ignored(self):
        del os.environ[FLAG_ENV]
        cb = self.cb()
        t = Trainer([cb], max_steps=1)
        cb.setup(t, None, "validate")  # would raise for "fit"
        cb.teardown(t, None, "validate")
        self.assertIsNone(cb.fault_tol_client)

    def test_no_timeouts_without_a_launcher(self):
        ckpt = os.path.join(self.dir, "ckpt.json")
        for _ in range(2):
            Trainer([self.cb()], max_steps=20, stop_after_steps=4).fit(ckpt_path=ckpt)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "_ft_state.json")),
                         "the no-op client has no timeouts to persist")


if __name__ == "__main__":
    unittest.main()
