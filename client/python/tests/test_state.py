"""ft_launcher_client.state without torch (states of plain Python objects);
tests/state_check.py covers tensors with Debian's torch."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from ft_launcher_client import state


class PlainStateTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="ftstate-plain-")
        self.shm = os.path.join(self.root, "shm")
        os.mkdir(self.shm)
        self.dir = os.path.join(self.root, "ckpt")
        self.addCleanup(shutil.rmtree, self.root)

    def env(self, launcher):
        e = {"LOCAL_RANK": "0", "RANK": "2", state.DIR_ENV: self.dir}
        if launcher:
            e[state.SHM_DIR_ENV] = self.shm
        p = mock.patch.dict(os.environ, e)
        p.start()
        self.addCleanup(p.stop)
        if not launcher:
            os.environ.pop(state.SHM_DIR_ENV, None)

    def test_memory_round_trip_with_and_without_crc(self):
        self.env(launcher=True)
        s = {"a": [1, 2.5, {"b": b"\x00\xff"}], "n": None}
        for checksum in (False, True):
            info = {}
            self.assertEqual(state.save(4, s, checksum=checksum)["where"], "memory")
            self.assertEqual(state.load(info=info), (4, s))
            self.assertEqual(info["source"], "memory")

    def test_without_launcher_writes_files(self):
        self.env(launcher=False)
        self.assertEqual(state.load(), (None, None))
        self.assertEqual(state.save(1, {"x": 1})["where"], "file")
        self.assertEqual(state.load_file(self.dir), (1, {"x": 1}))
        self.assertEqual(sorted(os.listdir(self.dir)), ["rank-2-own-1.ftstate", "rank-2.json"])

    def test_truncated_file_is_refused(self):
        self.env(launcher=False)
        state.save(1, {"x": "y" * 1000})
        path = os.path.join(self.dir, "rank-2-own-1.ftstate")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 10)
        with self.assertRaises(state.StateError):
            state.load_file(path)

    def test_many_saves_and_a_reader_racing_the_writer(self):
        # Saves past the first of each slot go through the saver's mapping
        # of the segment; a reader in another process racing them gets one
        # whole save each time (the descriptor is checked after the read).
        # A smoke test: a pickled save is mostly pickling, so reads seldom
        # overlap a write here; tests/state_check.py's
        # test_reader_racing_writer (tensors) does, and fails without the check.
        self.env(launcher=True)
        for step in range(1, 7):
            state.save(step, {"step": step, "blob": bytes([step]) * 100_000})
            self.assertEqual(state.load(), (step, {"step": step, "blob": bytes([step]) * 100_000}))
        code = (
            "import sys; from ft_launcher_client import state\n"
            "for step in range(1, 10**6):\n"
            "    state.save(step, {'step': step, 'blob': bytes([step % 256]) * 3_000_000})\n"
            "    if step == 3: print('saving', flush=True)\n"
        )
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             cwd=os.path.join(os.path.dirname(__file__), ".."))
        try:
            self.assertEqual(p.stdout.readline().strip(), b"saving")
            seen = set()
            for _ in range(60):
                self.assertIsNone(p.poll(), "the saver exited")
                step, got = state.load()
                self.assertEqual(got["step"], step)
                self.assertEqual(got["blob"], bytes([step % 256]) * 3_000_000, "a load mixed two saves")
                seen.add(step)
            self.assertGreater(len(seen), 1, "the loads did not see the saver move on")
        finally:
            p.kill()
            p.wait()
            p.stdout.close()

    def test_no_torch_import(self):
        # Importing the module and saving plain objects never imports torch.
        code = "import sys; from ft_launcher_client import state; assert 'torch' not in sys.modules"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.join(os.path.dirname(__file__), ".."))


if __name__ == "__main__":
    unittest.main()
