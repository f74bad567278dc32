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

Where the launcher asks for torch's NCCL flight recorder
(FT_LAUNCHER_STACKS_FR=1), install() also makes a FIFO <dir>/<pid>.frq and
starts one daemon thread blocked reading it: a byte written there makes the
thread call torch's _dump_nccl_trace (only if torch is already loaded) and
write what it returns to <dir>/<pid>.fr, or an empty <pid>.fr when this
process has no flight recorder. A thread, not a signal handler, because
the dump is a Python call and a hung main thread never comes back to the
interpreter; NCCL waits release the GIL.

Otherwise no thread, nothing printed; every error is swallowed: the rank
runs as it would without the hook.
"""
import os
import sys

_DIR_VAR = "FT_LAUNCHER_STACKS_DIR"
_SIG_VAR = "FT_LAUNCHER_STACKS_SIGNAL"
_FR_VAR = "FT_LAUNCHER_STACKS_FR"
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
    if os.environ.get(_FR_VAR) == "1":
        try:
            _start_fr(d)
        except Exception:
            pass
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
    # A forked child (a DataLoader worker) has no NCCL communicator and no
    # flight-recorder thread: it does not keep its parent's FIFO open.
    fd = _state.pop("frfd", None)
    if fd is not None:
        try:
            os.close(fd)
        except Exception:
            pass
    try:
        _register()
    except Exception:
        pass


def _start_fr(d):
    import threading
    req = os.path.join(d, "%d.frq" % os.getpid())
    os.mkfifo(req, 0o600)
    # O_RDWR: the open does not wait for a writer and the reads never see
    # end of file between the launcher's requests.
    fd = os.open(req, os.O_RDWR)
    _state["frfd"] = fd
    out = os.path.join(d, "%d.fr" % os.getpid())
    t = threading.Thread(target=_fr_loop, args=(fd, out), name="ft-launcher-flight-recorder", daemon=True)
    t.start()


def _fr_dump():
    """torch's flight recorder of this process, pickled by torch; b"" when
    there is none (torch not loaded, built without NCCL, buffer off)."""
    m = sys.modules.get("torch._C._distributed_c10d")
    f = getattr(m, "_dump_nccl_trace", None) if m is not None else None
    if f is None:
        return b""
    try:
        # The Python stacks are taken apart; the collectives' own stack
        # traces would make the dump ten times larger.
        b = f(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except TypeError:
        b = f()
    return bytes(b) if b else b""


def _fr_loop(fd, out):
    while True:
        try:
            if not os.read(fd, 1):
                return
        except InterruptedError:
            continue
        except Exception:
            return
        try:
            b = _fr_dump()
        except Exception:
            b = b""
        try:
            tmp = out + ".tmp"
            with open(tmp, "wb") as f:
                f.write(b)
            os.replace(tmp, out)
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
