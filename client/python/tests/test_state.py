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

    def test_no_torch_import(self):
        # Importing the module and saving plain objects never imports torch.
        code = "import sys; from ft_launcher_client import state; assert 'torch' not in sys.modules"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.join(os.path.dirname(__file__), ".."))


if __name__ == "__main__":
    unittest.main()
