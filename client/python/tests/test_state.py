"""ft_launcher_client.state without torch (states of plain Python objects);
tests/state_check.py covers tensors with Debian's torch."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import struct
import unittest
import warnings
import zlib
from unittest import mock

from ft_launcher_client import state
from ft_launcher_client.state import format as state_format
from ft_launcher_client.state import segment as state_segment


class _Plain:
    def __eq__(self, other):
        return isinstance(other, _Plain)


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

    def seg(self):
        return os.path.join(self.shm, "rank-0")

    def slots(self):
        fd = os.open(self.seg(), os.O_RDONLY)
        try:
            return state_segment.slots(fd)
        finally:
            os.close(fd)

    def flip(self, off, bit=0x10):
        with open(self.seg(), "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ bit]))

    def newest(self):
        ds = self.slots()
        return ds[state_segment.newest(ds)]

    def load_warned(self, **kw):
        info = {}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with self.assertLogs("ft_launcher_client.state", "WARNING") as logs:
                got = state.load(info=info, **kw)
        ws = [x for x in w if issubclass(x.category, state.CorruptStateWarning)]
        self.assertTrue(ws, "no CorruptStateWarning")
        self.assertIn("damaged", "".join(logs.output))
        return got, info, str(ws[0].message)

    def notes(self):
        out = []
        for n in sorted(os.listdir(self.shm)):
            if n.startswith("restore-"):
                with open(os.path.join(self.shm, n)) as f:
                    out.append(json.load(f))
                os.unlink(os.path.join(self.shm, n))
        return out

    def test_bit_flip_in_newest_slot_falls_back_to_the_older(self):
        # A bit flipped in the newest save's tensor-like bytes: with the
        # checksum (the default) its CRC fails, load() warns and returns
        # the older save in memory; the launcher gets the rejection in the
        # restore note (its state_corrupt event).
        self.env(launcher=True)
        s1 = {"step": 1, "blob": bytes(range(256)) * 400}
        s2 = {"step": 2, "blob": bytes(reversed(range(256))) * 400}
        state.save(1, s1)
        state.save(2, s2)
        d = self.newest()
        self.assertEqual(d[1], 2)
        self.assertTrue(d[8] & state.FLAG_CRC, "the checksum is not on by default")
        self.flip(d[2] + d[3] // 2)  # inside the blob: the pickle still decodes
        self.assertEqual(state.load(verify=False)[1]["blob"] != s2["blob"], True, "the flip missed the blob")
        self.notes()
        (step, got), info, msg = self.load_warned()
        self.assertEqual((step, got), (1, s1))
        self.assertEqual(info["source"], "memory")
        self.assertEqual([(r["source"], r["seq"], r["step"]) for r in info["rejected"]], [("memory", 2, 2)])
        self.assertIn("CRC", info["rejected"][0]["error"])
        self.assertIn("save 2 (step 2)", msg)
        notes = self.notes()
        self.assertEqual(len(notes), 1)
        self.assertEqual((notes[0]["step"], notes[0]["source"]), (1, "memory"))
        self.assertEqual([(r["seq"], r["step"]) for r in notes[0]["rejected"]], [(2, 2)])
        # The next save goes into the damaged save's slot (the older one
        # is the newest intact save), and loads clean.
        state.save(3, {"step": 3})
        with warnings.catch_warnings():
            warnings.simplefilter("error", state.CorruptStateWarning)
            self.assertEqual(state.load(), (3, {"step": 3}))

    def test_damage_without_checksum_detected_by_consistency(self):
        # checksum=False: no CRC over the payload, so damage is noticed
        # only where it breaks the descriptor or the payload's structure.
        self.env(launcher=True)
        s1, s2 = {"step": 1, "x": [1.5] * 100}, {"step": 2, "x": [2.5] * 100}
        for where in ("payload header", "descriptor", "descriptor offset"):
            with self.subTest(where=where):
                state.save(1, s1, checksum=False)
                state.save(2, s2, checksum=False)
                ds = self.slots()
                i = state_segment.newest(ds)
                d = ds[i]
                self.assertFalse(d[8] & state.FLAG_CRC)
                if where == "payload header":
                    self.flip(d[2] + 2)  # the payload's magic
                elif where == "descriptor":
                    self.flip(state.DESC_OFF[i] + 9)  # the step's bytes: the descriptor's own CRC fails
                else:
                    # A descriptor that checks out but names another slot's bytes.
                    b = state_format.desc_pack(d[0], d[1], state.HEADER + (1 - i) * d[4], d[3], d[4], d[5], d[6], d[7], d[8])
                    with open(self.seg(), "r+b") as f:
                        f.seek(state.DESC_OFF[i])
                        f.write(b)
                (step, got), info, msg = self.load_warned()
                self.assertEqual((step, got), (1, s1))
                self.assertEqual(info["rejected"][0]["source"], "memory")
                self.assertEqual(info["rejected"][0]["slot"], i)
                self.notes()

    def test_every_source_damaged_raises(self):
        self.env(launcher=True)
        state.save(1, {"a": b"x" * 5000})
        state.save(2, {"a": b"y" * 5000})
        for d in self.slots():
            self.flip(d[2] + d[3] - 100)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", state.CorruptStateWarning)
            with self.assertLogs("ft_launcher_client.state", "WARNING"):
                with self.assertRaises(state.StateError) as cm:
                    state.load()
        self.assertIn("no intact saved state", str(cm.exception))
        self.assertIn("save 2 (step 2) in memory slot", str(cm.exception))

    def test_damaged_newest_falls_back_to_a_newer_file_than_the_older_slot(self):
        # Sources by freshness: memory step 3 (damaged), the file's step
        # 2, memory step 1: the file is read, not the older slot.
        self.env(launcher=True)
        state.save(1, {"s": 1})
        shm = os.environ.pop(state.SHM_DIR_ENV)
        state.save(2, {"s": 2})  # no launcher: to the state directory
        os.environ[state.SHM_DIR_ENV] = shm
        state.save(3, {"s": 3, "pad": b"z" * 1000})
        d = self.newest()
        self.flip(d[2] + d[3] - 50)
        (step, got), info, _ = self.load_warned()
        self.assertEqual((step, got, info["source"]), (2, {"s": 2}, "file"))
        # The file damaged too: the older slot.
        path = os.path.join(self.dir, "rank-2-own-1.ftstate")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 3)
            f.write(b"\xff")
        (step, got), info, _ = self.load_warned()
        self.assertEqual((step, got, info["source"]), (1, {"s": 1}, "memory"))
        self.assertEqual([r["source"] for r in info["rejected"]], ["memory", "file"])

    def test_damaged_manifest_falls_back_to_memory(self):
        self.env(launcher=True)
        state.save(1, {"s": 1})
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "rank-2.json"), "w") as f:
            f.write('{"format": "ft-launcher-state/1", "step": 9, "fi')  # cut short
        (step, got), info, _ = self.load_warned()
        self.assertEqual((step, got, info["source"]), (1, {"s": 1}, "memory"))
        self.assertEqual(info["rejected"][0]["source"], "file")

    def test_untrusted_class_raises_and_does_not_fall_back(self):
        # Naming a class the caller did not trust is the caller's policy,
        # not damage: load() raises instead of passing over to an older
        # save (its CRC holds).
        self.env(launcher=True)
        state.save(1, {"s": 1})
        state.save(2, {"s": 2, "obj": _Plain()})
        with warnings.catch_warnings():
            warnings.simplefilter("error", state.CorruptStateWarning)
            with self.assertRaises(state.UntrustedClassError):
                state.load()
            self.assertEqual(state.load(trusted_classes=[_Plain])[0], 2)

    def test_manifest_and_file_must_agree(self):
        self.env(launcher=False)
        state.save(1, {"x": 1})
        state.save(2, {"x": 2})
        mp = os.path.join(self.dir, "rank-2.json")
        with open(mp) as f:
            m = json.load(f)
        m["step"] = 7
        with open(mp, "w") as f:
            json.dump(m, f)
        with self.assertRaises(state.StateError) as cm:
            state.load_file(self.dir)
        self.assertIn("manifest names step 7", str(cm.exception))

    def test_saver_leaves_the_slot_the_writer_pinned(self):
        # The launcher's writer pins the save it copies (PIN_OFF); the
        # saver writes the other slot even when that one holds the newest
        # save, so a rank saving faster than a write-out cannot overwrite
        # the save being written out.
        self.env(launcher=True)
        state.save(1, {"s": 1, "b": b"1" * 3000})
        state.save(2, {"s": 2, "b": b"2" * 3000})

        def pin(seq, good=True):
            b = struct.pack("<Q", seq)
            c = zlib.crc32(b) ^ (0 if good else 1)
            with open(self.seg(), "r+b") as f:
                f.seek(state.PIN_OFF)
                f.write(b + struct.pack("<II", c, 0))

        def image(i):
            ds = self.slots()
            with open(self.seg(), "rb") as f:
                f.seek(ds[i][2])
                return ds[i], f.read(ds[i][3])

        ds = self.slots()
        old = [i for i in (0, 1) if ds[i][1] == 1][0]
        before = image(old)
        pin(ds[old][0])  # the writer copies step 1 (the older save)
        for step in (3, 4, 5):
            state.save(step, {"s": step})
            self.assertEqual(image(old), before, "the pinned save was touched")
            self.assertEqual(state.load(), (step, {"s": step}))
        pin(0)  # unpinned: the saver alternates again
        state.save(6, {"s": 6})
        self.assertEqual(self.slots()[old][1], 6)
        # A torn or damaged pin pins nothing.
        ds = self.slots()
        pin(ds[1 - old][0], good=False)
        state.save(7, {"s": 7})
        self.assertEqual(self.slots()[1 - old][1], 7)

    def test_crc_combine_matches_one_pass(self):
        for la, lb in [(0, 5), (5, 0), (1, 1), (1000, 77777), (1 << 20, 3 << 20)]:
            a, b = os.urandom(la), os.urandom(lb)
            self.assertEqual(state_format.crc32_combine(zlib.crc32(a), zlib.crc32(b), lb), zlib.crc32(a + b))
        bufs = [memoryview(bytearray(os.urandom(n))) for n in (100, 20 << 20, 3, 9 << 20)]
        want = 0
        for b in bufs:
            want = zlib.crc32(b, want)
        for n in (1, 2, 3, 4):
            self.assertEqual(state_format.crc_bufs(bufs, n), want, n)

    def test_no_torch_import(self):
        # Importing the module and saving plain objects never imports torch.
        code = "import sys; from ft_launcher_client import state; assert 'torch' not in sys.modules"
        subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.join(os.path.dirname(__file__), ".."))


if __name__ == "__main__":
    unittest.main()
