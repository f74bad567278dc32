"""The shape of ft_launcher_client.state (issue 47): a package split by
concern whose modules import one another in one direction only (no
cycle, counting imports inside functions, which is how state.py and
heal.py used to import each other), none reaching into another's private
names, each of them importable on its own, and the public API users
import from ft_launcher_client.state unchanged."""

import ast
import os
import subprocess
import sys
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PKG = "ft_launcher_client"
MAX_LINES = 600

# What `from ft_launcher_client import state` offered before the split
# (every public name of the old state.py).
PUBLIC = [
    "Bound", "COPY_THREADS_ENV", "CorruptStateWarning", "DEFAULT_DIR", "DESC_OFF", "DIR_ENV", "FILE_HEADER",
    "FILE_MAGIC", "FILE_VERSION", "FLAG_CRC", "FLAG_SAVE_CRC", "HEADER", "MAGIC", "MANIFEST_FORMAT", "PIN_OFF",
    "SHM_DIR_ENV", "StateError", "TRUSTED_BY_DEFAULT", "TRUSTED_CLASSES_ENV", "UntrustedClassError", "copy_threads",
    "heal", "load", "load_file", "log", "save", "wait",
]
HEAL_PUBLIC = ["DEFAULT_TIMEOUT", "FALLBACK", "KEPT", "KEY_PREFIX", "LOAD", "PEER", "check_groups", "decide", "heal"]


def modules():
    """{dotted name: (path, is_package)} of every module of the package."""
    out = {}
    base = os.path.join(ROOT, PKG)
    for d, dirs, files in os.walk(base):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for fn in files:
            if not fn.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(d, fn), ROOT)[:-3].split(os.sep)
            pkg = rel[-1] == "__init__"
            if pkg:
                rel = rel[:-1]
            out[".".join(rel)] = (os.path.join(d, fn), pkg)
    return out


def _resolve(mod, is_pkg, level, name):
    """The absolute name of a relative import in module mod."""
    if level == 0:
        return name
    parts = mod.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if level > 1:
        parts = parts[:-(level - 1)]
    return ".".join(parts + ([name] if name else []))


def source(mods, mod):
    path, _ = mods[mod]
    if isinstance(path, tuple):  # ("<test>", text): a module made up by a test
        return path[1]
    with open(path) as f:
        return f.read()


def imports(mods):
    """{module: [(imported module, names imported from it, the local
    names bound to package modules)]} for every import statement,
    those inside functions included."""
    out = {}
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(source(mods, mod))
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    found.append((a.name, [], {a.asname: a.name} if a.asname else {}))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(mod, is_pkg, node.level, node.module)
                names, bound = [], {}
                for a in node.names:
                    sub = target + "." + a.name
                    if sub in mods:  # from . import copying: the submodule itself
                        found.append((sub, [], {a.asname or a.name: sub}))
                    else:
                        names.append(a.name)
                found.append((target, names, bound))
        out[mod] = found
    return out


def graph(mods):
    """{module: set of package modules it imports}. Importing a.b.c runs
    a and a.b first: those count too, except the importer's own parents
    (already running when it is imported)."""
    g = {m: set() for m in mods}
    for mod, found in imports(mods).items():
        own = {mod.rsplit(".", i)[0] for i in range(1, mod.count(".") + 1)}
        for target, _, _ in found:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                t = ".".join(parts[:i])
                if t in mods and t != mod and t not in own:
                    g[mod].add(t)
    return g


def find_cycle(g):
    """One import cycle as a list of modules, or None."""
    state = {}
    stack = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                c = visit(n)
                if c:
                    return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            c = visit(m)
            if c:
                return c
    return None


class StatePackageTest(unittest.TestCase):
    def setUp(self):
        self.mods = modules()
        self.state = sorted(m for m in self.mods if m == PKG + ".state" or m.startswith(PKG + ".state."))

    def test_state_is_a_package_split_by_concern(self):
        self.assertTrue(self.mods[PKG + ".state"][1], "ft_launcher_client.state is not a package")
        self.assertFalse(os.path.exists(os.path.join(ROOT, PKG, "state.py")), "state.py beside the state package")
        for m in ("common", "copying", "into", "format", "segment", "files", "saving", "restore", "transport",
                  "peerheal", "bound"):
            self.assertIn(PKG + ".state." + m, self.mods)
        for m in self.state + [PKG + ".heal"]:
            path = self.mods[m][0]
            src = source(self.mods, m)
            self.assertLess(src.count("\n"), MAX_LINES, "%s: %d lines" % (path, src.count("\n")))
            self.assertTrue(ast.get_docstring(ast.parse(src)), "%s has no module docstring" % path)

    def test_no_import_cycle(self):
        g = graph(self.mods)
        self.assertIsNone(find_cycle(g))
        # The checker sees a cycle where there is one: the one state.py
        # and heal.py used to make with imports inside functions.
        bad = {k: set(v) for k, v in g.items()}
        bad[PKG + ".state.format"].add(PKG + ".state.peerheal")
        self.assertIsNotNone(find_cycle(bad))
        # The peer heal sits above the state modules, not beside them.
        self.assertIn(PKG + ".state.peerheal", g[PKG + ".heal"])
        self.assertNotIn(PKG + ".heal", set().union(*(g[m] for m in self.state)))

    def reach_ins(self, mods):
        """Each use of another package module's private name anywhere in
        ft_launcher_client (the state package, heal.py, the client, the
        in-process API...)."""
        def ours(mod):
            return mod == PKG or mod.startswith(PKG + ".")

        found = imports(mods)
        bad = []
        for mod in mods:
            aliases = {}
            for target, names, bound in found[mod]:
                aliases.update(bound)
                if target.split(".")[0] == PKG and (ours(mod) or ours(target)):
                    bad += ["%s: from %s import %s" % (mod, target, n) for n in names if n.startswith("_")]
            for node in ast.walk(ast.parse(source(mods, mod))):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in aliases and (ours(mod) or ours(aliases[node.value.id]))
                        and node.attr.startswith("_") and not node.attr.startswith("__")):
                    bad.append("%s: %s.%s" % (mod, aliases[node.value.id], node.attr))
        return bad

    def test_no_module_reaches_into_anothers_private_names(self):
        self.assertEqual(self.reach_ins(self.mods), [])
        # The checker sees a reach-in where there is one (what heal.py did
        # with state._Pickler and state._load), in both forms.
        fake = dict(self.mods)
        fake[PKG + ".state.fake"] = (("<test>", "from .format import _PAYLOAD\nfrom . import copying as c\n"
                                               "def f():\n    c._run_range(None, [])\n"), False)
        self.assertEqual(self.reach_ins(fake), [PKG + ".state.fake: from %s.state.format import _PAYLOAD" % PKG,
                                                PKG + ".state.fake: %s.state.copying._run_range" % PKG])

    def test_each_module_imports_on_its_own(self):
        # A fresh interpreter per module: an import cycle that depends on
        # which module comes first fails here. Torch is never imported.
        for m in self.state + [PKG + ".heal"]:
            code = "import importlib, sys; importlib.import_module(%r); assert 'torch' not in sys.modules" % m
            r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, "%s:\n%s" % (m, r.stderr))

    def test_public_api_unchanged(self):
        from ft_launcher_client import heal, state

        for n in PUBLIC:
            self.assertTrue(hasattr(state, n), "ft_launcher_client.state.%s" % n)
        for n in HEAL_PUBLIC:
            self.assertTrue(hasattr(heal, n), "ft_launcher_client.heal.%s" % n)
        self.assertTrue(callable(state.heal) and callable(state.save) and callable(state.load))
        self.assertIs(heal.heal, state.peerheal.heal)
        self.assertTrue(issubclass(state.UntrustedClassError, state.StateError))
        self.assertEqual(state.log.name, "ft_launcher_client.state")
        self.assertEqual(heal.log.name, "ft_launcher_client.heal")
        self.assertEqual(sorted(state.__all__), sorted(n for n in PUBLIC if n != "log"))


if __name__ == "__main__":
    unittest.main()
