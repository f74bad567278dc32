"""ft-launcher: let the launcher read this rank's Python stacks.

The launcher names a directory in FT_LAUNCHER_STACKS_DIR and a signal
number in FT_LAUNCHER_STACKS_SIGNAL. install() opens <dir>/<pid>.txt for
appending and registers faulthandler on that signal for every thread:
faulthandler's C handler writes the dump at once, whatever the threads are
blocked in (a lock, a read, a collective), where a Python signal handler
would wait for the main thread to come back to the interpreter. Unless the
program enabled faulthandler itself (PYTHONFAULTHANDLER, -X faulthandler),
its fatal-error handler (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) writes
to the same file, so a rank killed by one is explained. An uncaught
exception's traceback is written to <dir>/<pid>.exc before the previous
sys.excepthook prints it, so a crash is explained without an error file
or redirected output. A forked child (a DataLoader worker) gets files of
its own.

No thread, nothing printed; every error is swallowed: the rank runs as it
would without the hook.
"""
import os
import sys

_DIR_VAR = "FT_LAUNCHER_STACKS_DIR"
_SIG_VAR = "FT_LAUNCHER_STACKS_SIGNAL"
_HOOK = os.path.dirname(os.path.abspath(__file__))
_state = {}


def _strip():
    """Take the hook's directory off sys.path and PYTHONPATH."""
    sys.path[:] = [p for p in sys.path if p != _HOOK]
    pp = os.environ.get("PYTHONPATH")
    if pp is None:
        return
    if pp == _HOOK:
        del os.environ["PYTHONPATH"]
    elif pp.startswith(_HOOK + os.pathsep):
        os.environ["PYTHONPATH"] = pp[len(_HOOK) + 1:]


def _register():
    import faulthandler
    old = _state.get("file")
    f = open(os.path.join(_state["dir"], "%d.txt" % os.getpid()), "a")
    faulthandler.register(_state["sig"], file=f, all_threads=True, chain=False)
    if _state["fatal"]:
        faulthandler.enable(file=f, all_threads=True)
    _state["file"] = f  # faulthandler writes to its descriptor: keep it open
    if old is not None:
        try:
            old.close()
        except Exception:
            pass


def install():
    _strip()
    d = os.environ.get(_DIR_VAR)
    s = os.environ.get(_SIG_VAR)
    if not d or not s or "file" in _state:
        return
    try:
        import faulthandler
        _state.update(dir=d, sig=int(s), fatal=not faulthandler.is_enabled())
        _register()
        os.register_at_fork(after_in_child=_child)
    except Exception:
        _state.pop("file", None)
        return
    prev = sys.excepthook

    def hook(kind, value, tb):
        try:
            import traceback
            with open(os.path.join(d, "%d.exc" % os.getpid()), "w") as f:
                f.write("".join(traceback.format_exception(kind, value, tb)))
        except Exception:
            pass
        prev(kind, value, tb)

    sys.excepthook = hook


def _child():
    try:
        _register()
    except Exception:
        pass


def chain():
    """Run the sitecustomize this module's shadows, if any, as Python would
    have: as the module sitecustomize."""
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if p != _HOOK])
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = mod
    spec.loader.exec_module(mod)
