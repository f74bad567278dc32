"""ft-launcher --prewarm auto: report the modules this rank imports.

The launcher names a file in FT_LAUNCHER_PREWARM_REPORT. install() adds an
audit hook that, on an import at most once in 5 s (not in the first 5 s,
the rank's start-up), and at exit, writes there (atomically: a temporary file renamed) the names of the imported
modules a standby may import ahead: not the standard library, not the
script's own code (under the script's directory or the working directory,
outside site-packages), not this hook; a line "=name" is a module that was
there when the hook was installed (a standby's import), "name" one the rank
imported itself. No thread is started; nothing is printed; every error is
swallowed (a report is best effort).
"""
import os
import sys

_VAR = "FT_LAUNCHER_PREWARM_REPORT"
_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP = {"__main__", "sitecustomize", "usercustomize", "_ftl_learn"}
_PERIOD = 5.0  # seconds between reports while the rank imports


def _strip():
    """Take the hook's directory off sys.path and PYTHONPATH."""
    sys.path[:] = [p for p in sys.path if p != _DIR]
    pp = os.environ.get("PYTHONPATH")
    if pp is None:
        return
    if pp == _DIR:
        del os.environ["PYTHONPATH"]
    elif pp.startswith(_DIR + os.pathsep):
        os.environ["PYTHONPATH"] = pp[len(_DIR) + 1:]


def _own_roots():
    roots = set()
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None)
    dirs = [os.path.dirname(os.path.abspath(f))] if f else []
    try:
        dirs.append(os.getcwd())
    except OSError:
        pass
    for d in dirs:  # as given and resolved; module paths are compared as given (no stat per module)
        roots.update((d.rstrip("/") + "/", os.path.realpath(d).rstrip("/") + "/"))
    return tuple(roots)


def _names(pre):
    std = getattr(sys, "stdlib_module_names", frozenset())
    roots = _own_roots()
    out = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name in _SKIP or name.split(".", 1)[0] in std:
            continue
        if name.split(".", 1)[0] in sys.builtin_module_names:
            continue
        spec = getattr(mod, "__spec__", None)
        if spec is None or spec.name != name:
            continue  # an alias (a C submodule registered by hand)
        f = getattr(mod, "__file__", None) or ""
        if f and "-packages/" not in f and f.startswith(roots):
            continue  # the user's own code
        out.append("=" + name if name in pre else name)
    return out


def _write(path, pre):
    data = "\n".join(_names(pre)).encode("utf-8", "replace") + b"\n"
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def install():
    """Report to $FT_LAUNCHER_PREWARM_REPORT (taken out of the environment,
    so child processes do not report)."""
    _strip()
    path = os.environ.pop(_VAR, None)
    if not path:
        return
    import _thread
    import atexit
    import time
    pre = frozenset(sys.modules)
    pid = os.getpid()  # a forked child (a fork-started DataLoader worker) does not report
    lock = _thread.allocate_lock()  # one report at a time; its own file writes do not recurse
    # The first report waits a period too: the rank's start-up (a restart's
    # critical path) pays for no report.
    st = {"last": time.monotonic(), "n": 0}

    def report(force=False):
        if os.getpid() != pid or not lock.acquire(False):
            return
        try:
            if force or len(sys.modules) != st["n"]:
                st["n"] = len(sys.modules)
                _write(path, pre)
        except Exception:
            pass
        finally:
            lock.release()

    def hook(event, args):
        if event != "import" or lock.locked():
            return
        now = time.monotonic()
        if now - st["last"] < _PERIOD:
            return
        st["last"] = now
        report()

    sys.addaudithook(hook)
    atexit.register(report, True)


def chain():
    """Run the sitecustomize this module's shadows, if any, as Python would
    have: as the module sitecustomize."""
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if p != _DIR])
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = mod
    spec.loader.exec_module(mod)
