"""ft-launcher --prewarm auto: report the modules this rank imports.

The launcher names a file in FT_LAUNCHER_PREWARM_REPORT. install() writes
there (atomically: a temporary file renamed) the names of the imported
modules a standby may import ahead: not the standard library, not the
script's own code (under the script's directory or the working directory,
outside site-packages), not this hook; a line "=name" is a module that was
there when the hook was installed (a standby's import), "name" one the rank
imported itself.

A report is written when the imports go quiet: at the first audited event
(an audit hook) or garbage collection (gc.callbacks) that comes _QUIET s or
more after the last import began, with no import still running (one that
runs _PERIOD s, a script run from inside an import, no longer holds it
back), when the modules changed since the last report.
A rank that crashes (os._exit, a signal, SIGKILL) runs no atexit handler,
and a training script imports everything at its start, then nothing: the
report must wait for neither. A torch optimizer step raises audited events
(it keys its state by tensor, and a tensor's hash is id(), which is
audited); building a model or a data set allocates, so collections run (a
steady loop that frees what it allocates runs none). So a rank that took
optimizer steps for _QUIET s after its imports has reported them. Also on an import
at most once in _PERIOD s (not in the first _PERIOD s) while imports go
on, and at exit. None is written while the start-up imports.

No thread, no signal handler: the audit hook and the gc callback run in
whatever thread raised the event, and when no report is due they return
after a compare. A forked child (a fork-started DataLoader worker) never
reports: the pid is checked before a write. Nothing is printed; every error
is swallowed (a report is best effort).
"""
import os
import sys

_VAR = "FT_LAUNCHER_PREWARM_REPORT"
_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP = {"__main__", "sitecustomize", "usercustomize", "_ftl_learn"}
_PERIOD = 5.0  # seconds between reports while the rank imports
# Seconds without an import before a report is due: longer than the gaps
# between the imports of a start-up (so it writes none while it imports),
# shorter than a crash that comes soon after the imports.
_QUIET = 0.5


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
    import gc
    import time
    pre = frozenset(sys.modules)
    pid = os.getpid()  # a forked child (a fork-started DataLoader worker) does not report
    lock = _thread.allocate_lock()  # one report at a time; its own file writes do not recurse
    clock, wait = time.monotonic, _QUIET
    # An import in progress holds a module lock, listed here (importlib's).
    locks = getattr(sys.modules.get("_frozen_importlib"), "_module_locks", None)
    if locks is None:
        locks = {}
    # The first periodic report waits a period too: the rank's start-up (a
    # restart's critical path) pays for no report.
    last = imported = clock()
    due = False  # imported since the last report
    n = -1  # len(sys.modules) at the last report

    def report(force=False):
        nonlocal n
        try:
            if os.getpid() != pid or not lock.acquire(False):
                return
        except Exception:
            return  # at interpreter shutdown
        try:
            if force or len(sys.modules) != n:
                n = len(sys.modules)
                _write(path, pre)
        except Exception:
            pass
        finally:
            lock.release()

    def quiet():
        # No import for a while: write what the imports brought, once.
        nonlocal due
        if lock.locked():
            return  # a report is being written (its own file calls are audited)
        if locks and clock() - imported < _PERIOD:
            return  # one import is still running (loading libtorch takes seconds)
        due = False
        report()

    def hook(event, args):
        nonlocal last, imported, due
        if event != "import":
            if due and clock() - imported >= wait:
                quiet()
            return
        imported = clock()
        due = True
        if imported - last < _PERIOD or lock.locked():
            return
        last = imported
        report()

    def collected(phase, info):
        if due and clock() - imported >= wait:
            quiet()

    sys.addaudithook(hook)
    # Registered for good: removing a callback while the collector runs
    # them would make it skip the next one (it walks the list by index).
    gc.callbacks.append(collected)
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
