"""The client refuses a rank monitor that does not speak FTL1, at once and
without connecting: nvidia-resiliency-ext's ft_launcher sets the same
FT_RANK_MONITOR_IPC_SOCKET for a monitor that reads pickle frames, and the
native handshake would wait there until its 60 s timeout. ft-launcher sets
FT_RANK_MONITOR_PROTOCOL=ftl1; its older versions are known by
FT_LAUNCHER_RESTARTS_USED. The foreign socket here accepts and never
answers, as nvrx's monitor does with a native hello.
"""

import os
import shutil
import socket
import tempfile
import threading
import time
import unittest

from ft_launcher_client import RankMonitorClient, RankMonitorClientError
from ft_launcher_client.client import LAUNCHER_SOCKET_ENV, PROTOCOL_ENV, SOCKET_ENV, request_workload_action
from tests.test_inprocess import FakeMonitor

_KEYS = (SOCKET_ENV, LAUNCHER_SOCKET_ENV, PROTOCOL_ENV, "TORCHELASTIC_RUN_ID", "FT_LAUNCHER_RESTARTS_USED", "RANK",
         "LOCAL_RANK")


class SilentMonitor:
    """Accepts connections and reads, never writes (a pickle-framed monitor
    that took "FTL1" for a 1.18 GB length)."""

    def __init__(self, path):
        self.path = path
        self.accepted = 0
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(c)

    def close(self):
        self.srv.close()
        for c in self.conns:
            c.close()


class ProtocolTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.saved = {k: os.environ.get(k) for k in _KEYS}
        for k in _KEYS:
            os.environ.pop(k, None)
        os.environ.update(RANK="0", LOCAL_RANK="0")

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def env(self, **kv):
        for k, v in kv.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_refused_without_connecting(self):
        cases = [
            ("nvrx ft_launcher", dict(TORCHELASTIC_RUN_ID="job"), "nvidia-resiliency-ext"),
            ("another protocol", {"TORCHELASTIC_RUN_ID": "job", PROTOCOL_ENV: "ftl2", "FT_LAUNCHER_RESTARTS_USED": "0"},
             "'ftl2'"),
        ]
        for name, env, want in cases:
            with self.subTest(name):
                mon = SilentMonitor(os.path.join(self.dir, name.replace(" ", "_") + ".sock"))
                launcher = SilentMonitor(os.path.join(self.dir, name.replace(" ", "_") + ".launcher.sock"))
                try:
                    self.env(**{SOCKET_ENV: mon.path, LAUNCHER_SOCKET_ENV: launcher.path}, **env)
                    t0 = time.monotonic()
                    with self.assertRaises(RankMonitorClientError) as cm:
                        RankMonitorClient().init_workload_monitoring()
                    self.assertIn(want, str(cm.exception))
                    with self.assertRaises(RankMonitorClientError) as cm:
                        request_workload_action("ExcludeThisNode", "test")
                    self.assertIn(want, str(cm.exception))
                    self.assertLess(time.monotonic() - t0, 30, "refused only after a timeout")
                    time.sleep(0.1)  # an accept would have been counted by now
                    self.assertEqual((mon.accepted, launcher.accepted), (0, 0), "connected to a foreign monitor")
                finally:
                    mon.close()
                    launcher.close()
                    self.env(**{k: None for k in env})

    def test_ft_launcher_connects(self):
        cases = [
            ("marker", {"TORCHELASTIC_RUN_ID": "job", PROTOCOL_ENV: "ftl1", "FT_LAUNCHER_RESTARTS_USED": "0"}),
            ("older launcher, no marker", {"TORCHELASTIC_RUN_ID": "job", "FT_LAUNCHER_RESTARTS_USED": "0"}),
            ("no launcher variables", {}),
        ]
        for name, env in cases:
            with self.subTest(name):
                mon = FakeMonitor(os.path.join(self.dir, name.replace(" ", "_").replace(",", "") + ".sock"))
                try:
                    self.env(**{SOCKET_ENV: mon.path}, **env)
                    c = RankMonitorClient()
                    c.use_shared_memory = False
                    c.init_workload_monitoring()
                    self.assertTrue(mon.connected.wait(10))
                    self.assertEqual(len(mon.hellos), 1)
                    c.shutdown_workload_monitoring()
                finally:
                    mon.close()
                    self.env(**{k: None for k in env})


if __name__ == "__main__":
    unittest.main()
