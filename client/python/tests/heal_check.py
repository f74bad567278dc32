"""Tests of ft_launcher_client.heal over real torch gloo process groups.

Run by client/python/heal_test.go with Debian's python3 (torch); not named
test_*.py so that the torch-free unittest discovery does not collect it.
Four real ranks (processes, a TCPStore, gloo) run the scenarios below one
after the other; each rank first saves step 6 into its "launcher memory"
(a segment directory standing for the launcher's), which the fallbacks
must restore.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, ".."))

WORLD = 4
SAVED = 6  # the step every rank saved before the scenarios

# name -> (groups, {rank: the step it completed, None: a replacement},
#          the seed of each rank's live state: same seed, same state)
SCENARIOS = [
    ("data parallel", None, {0: 7, 1: None, 2: 7, 3: 7}, {0: 7, 2: 7, 3: 7}),
    ("replica groups", [[0, 2], [1, 3]], {0: 5, 1: 5, 2: 5, 3: None}, {0: 50, 2: 50, 1: 51}),
    ("survivors disagree", None, {0: 7, 1: None, 2: 8, 3: 7}, {0: 7, 2: 8, 3: 7}),
    ("a replica group without survivor", [[0, 1], [2, 3]], {0: 5, 1: 5, 2: None, 3: None}, {0: 50, 1: 50}),
]


def worker(out):
    import torch.distributed as dist

    from ft_launcher_client import state
    from state_check import make_state, same

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method="env://")
    state.save(SAVED, make_state(SAVED))
    results = {}
    for name, groups, steps, seeds in SCENARIOS:
        live = make_state(seeds[rank]) if steps[rank] is not None else None
        info = {}
        step, got = state.heal(steps[rank], live, groups=groups, info=info)
        # Which state came back: its seed, found by comparing.
        cands = {s: make_state(s) for s in set(seeds.values()) | {SAVED}}
        seed = [s for s, c in cands.items() if same(c, got)]
        results[name] = {"step": step, "seed": seed, "same_object": got is live and live is not None,
                         "heal": info["heal"], "source": info["source"], "why": info["why"],
                         "from_rank": info["from_rank"], "bytes": info["bytes"]}
        dist.barrier()
    with open(os.path.join(out, "rank-%d.json" % rank), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HealTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="ftheal-check-")
        cls.shm = os.path.join(cls.root, "shm")
        os.mkdir(cls.shm)
        port = str(_free_port())
        procs = []
        for r in range(WORLD):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port, FT_STATE_SHM_DIR=cls.shm, FT_STATE_DIR=os.path.join(cls.root, "files"),
                       TORCHELASTIC_RESTART_COUNT="1", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", cls.root], env=env,
                                          cwd=_HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        cls.logs = []
        try:
            for p in procs:
                out, _ = p.communicate(timeout=120)
                cls.logs.append((p.returncode, out.decode(errors="replace")))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        cls.res = {}
        for r in range(WORLD):
            try:
                with open(os.path.join(cls.root, "rank-%d.json" % r)) as f:
                    cls.res[r] = json.load(f)
            except OSError:
                pass
        cls.notes = []
        for n in sorted(os.listdir(cls.shm)):
            if n.startswith("restore-"):
                with open(os.path.join(cls.shm, n)) as f:
                    cls.notes.append(json.load(f))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root)

    def setUp(self):
        if len(self.res) != WORLD:
            self.fail("ranks failed: %s" % self.logs)

    def test_data_parallel(self):
        got = {r: self.res[r]["data parallel"] for r in range(WORLD)}
        # The replacement gets the lowest survivor's state, bit-identical;
        # the survivors keep their own object; nothing is read from memory.
        self.assertEqual((got[1]["heal"], got[1]["source"], got[1]["from_rank"], got[1]["step"], got[1]["seed"]),
                         ("peer", "peer", 0, 7, [7]))
        self.assertGreater(got[1]["bytes"], 10000)
        for r in (0, 2, 3):
            self.assertEqual((got[r]["heal"], got[r]["source"], got[r]["step"], got[r]["same_object"]),
                             ("peer", "live", 7, True))

    def test_replica_groups(self):
        got = {r: self.res[r]["replica groups"] for r in range(WORLD)}
        self.assertEqual((got[3]["source"], got[3]["from_rank"], got[3]["seed"]), ("peer", 1, [51]))
        for r in (0, 1, 2):
            self.assertTrue(got[r]["same_object"])

    def test_fallbacks_restore_the_newest_save(self):
        for name, why in [("survivors disagree", "disagree on the last completed step (step 7 on ranks 0, 3; step 8 on ranks 2)"),
                          ("a replica group without survivor", "replica group [2, 3] has no survivor")]:
            with self.subTest(name):
                for r in range(WORLD):
                    g = self.res[r][name]
                    self.assertEqual((g["heal"], g["source"], g["step"], g["seed"]), ("fallback", "memory", SAVED, [SAVED]))
                    self.assertIn(why, g["why"])

    def test_notes_reach_the_launcher(self):
        # Every heal leaves the launcher a restore note (state_restore):
        # the replacement's says peer and the rank it came from; a
        # fallback's says why, with the source load() found.
        peer = [n for n in self.notes if n.get("source") == "peer"]
        self.assertEqual(sorted((n["rank"], n["from_rank"], n["step"]) for n in peer), [(1, 0, 7), (3, 1, 5)])
        live = [n for n in self.notes if n.get("source") == "live"]
        self.assertEqual(len(live), 6)
        fb = [n for n in self.notes if n.get("heal") == "fallback"]
        self.assertEqual(len(fb), 2 * WORLD)
        for n in fb:
            self.assertEqual((n["source"], n["step"]), ("memory", SAVED))
            self.assertTrue(n["why"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        worker(sys.argv[2])
    else:
        unittest.main()
