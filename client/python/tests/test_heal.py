"""ft_launcher_client.heal without torch: the decision every rank applies
(who sends its state to whom, when to fall back) and heal() without a
process group. tests/heal_check.py runs heal() over real gloo groups."""

import os
import shutil
import tempfile
import unittest
from unittest import mock

from ft_launcher_client import heal, state


class DecideTest(unittest.TestCase):
    def test_decisions(self):
        for name, steps, world, groups, mode, step, sources, why in [
            ("data parallel, one replacement", {0: 7, 1: None, 2: 7}, 3, None, heal.PEER, 7, {"1": 0}, "receive step 7"),
            ("the lowest survivor sends", {0: None, 1: 7, 2: 7}, 3, None, heal.PEER, 7, {"0": 1}, ""),
            ("two replacements, one source", {0: None, 1: 4, 2: None, 3: 4}, 4, None, heal.PEER, 4, {"0": 1, "2": 1}, ""),
            ("every rank survived", {0: 3, 1: 3}, 2, None, heal.KEPT, 3, {}, "every rank holds step 3"),
            ("first round: nobody holds a state", {0: None, 1: None}, 2, None, heal.LOAD, None, {}, "no rank"),
            ("survivors disagree", {0: 7, 1: None, 2: 8}, 3, None, heal.FALLBACK, None, {},
             "disagree on the last completed step (step 7 on ranks 0; step 8 on ranks 2)"),
            ("replica groups: each from its own group", {0: 5, 1: 5, 2: None, 3: None}, 4, [[0, 2], [1, 3]],
             heal.PEER, 5, {"2": 0, "3": 1}, ""),
            ("replica group without a survivor", {0: 5, 1: None, 2: 5, 3: None}, 4, [[0, 2], [1, 3]],
             heal.FALLBACK, None, {}, "replica group [1, 3] has no survivor"),
            ("a rank in no group has no replica", {0: 5, 1: 5, 2: None}, 3, [[0, 1]], heal.FALLBACK, None, {},
             "replica group [2] has no survivor"),
        ]:
            with self.subTest(name):
                d = heal.decide(steps, world, groups)
                self.assertEqual((d["mode"], d["step"], d["sources"]), (mode, step, sources), d)
                self.assertIn(why, d["why"])

    def test_bad_groups(self):
        for groups, world, want in [
            ([[0, 4]], 4, "names rank 4; ranks are 0..3"),
            ([[0, 1], [1, 2]], 3, "rank 1 is in replica groups 0 and 1"),
            ([["a"]], 2, "want a list of ranks"),
        ]:
            with self.subTest(groups=groups):
                with self.assertRaises(ValueError) as c:
                    heal.check_groups(groups, world)
                self.assertIn(want, str(c.exception))

    def test_missing_report(self):
        with self.assertRaises(ValueError) as c:
            heal.decide({0: 1}, 3)
        self.assertIn("no report from ranks 1, 2", str(c.exception))


class NoGroupTest(unittest.TestCase):
    """Outside a process group (no torch here, or none initialised) there
    is nothing to heal: a live state comes back as it is, else load()."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="ftheal-")
        self.addCleanup(shutil.rmtree, self.root)
        p = mock.patch.dict(os.environ, {"RANK": "0", "LOCAL_RANK": "0", state.DIR_ENV: self.root})
        p.start()
        self.addCleanup(p.stop)
        os.environ.pop(state.SHM_DIR_ENV, None)

    def test_live_state_is_kept(self):
        live = {"w": [1, 2]}
        info = {}
        self.assertIs(heal.heal(4, live, info=info)[1], live)
        self.assertEqual((info["heal"], info["source"], info["step"]), (heal.KEPT, "live", 4))

    def test_nothing_live_loads(self):
        info = {}
        self.assertEqual(state.heal(None, None, info=info), (None, None))
        self.assertEqual((info["heal"], info["source"]), (heal.LOAD, None))
        state.save(9, {"x": 1})
        self.assertEqual(heal.heal(None, None, info=info), (9, {"x": 1}))
        self.assertEqual((info["heal"], info["source"]), (heal.LOAD, "file"))


if __name__ == "__main__":
    unittest.main()
