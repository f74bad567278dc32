# ft-launcher prewarm standby (embedded in the launcher, run with python -u -c).
#
# argv: MODE TARGET MODULES [auto]  (MODE "script" or "module"; TARGET the
# script path or module name, used only to give the imports the sys.path[0]
# the rank will have; MODULES comma separated; "auto": --prewarm auto, see
# below). fd 1 is the control socket to the launcher, fd 2 the launcher's
# diagnostics pipe.
#
# With "auto" the modules were learned (or are the built-in default list):
# one that is not installed is skipped, one that fails to import is skipped
# and reported (the launcher leaves it out from then on), and after each
# import the standby checks that it created no CUDA context and started no
# thread and no child process; one that did makes the standby report
# "U" + module + TAB + why and exit (the launcher drops the module and
# starts a new standby without it).
#
# Protocol (control socket): standby -> launcher "R" (ready; with "auto"
# followed by the skipped modules, comma separated) or "E" + text
# (import failed) and exit; launcher -> standby one message: 4-byte big
# endian length, then NUL-separated fields: cwd, argc, argv..., env..., with
# the rank's stdout and stderr attached (SCM_RIGHTS) to its first byte;
# standby -> launcher "S" right before the user's code runs, then the socket
# is closed. Only the main thread is used: no thread outlives the handover.
_ftl_g0 = dict(globals())


def _ftl_standby(g0):
    import sys
    import os
    import _signal
    import socket

    ctl = socket.socket(fileno=os.dup(1))
    os.dup2(2, 1)  # import-time output goes to the launcher's diagnostics
    mode, target, modules = sys.argv[1], sys.argv[2], sys.argv[3]
    auto = sys.argv[4:5] == ["auto"]
    nsig = getattr(_signal, "NSIG", 65)
    saved = {}
    for s in range(1, nsig):
        try:
            saved[s] = _signal.getsignal(s)
        except (OSError, ValueError):
            pass
    saved_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, [])

    def path0(mode, target):
        if mode == "module":
            return os.getcwd()
        return os.path.dirname(os.path.realpath(target))

    sys.path[0] = path0(mode, target)

    def cuda_context():
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        return cuda is not None and cuda.is_initialized()

    def tasks():
        # Threads and child processes of this process (from /proc).
        n, kids = 0, 0
        for t in os.listdir("/proc/self/task"):
            n += 1
            try:
                with open("/proc/self/task/%s/children" % t) as f:
                    kids += len(f.read().split())
            except OSError:
                pass
        return n, kids

    skipped = []
    try:
        import importlib
        if auto:
            import importlib.util
            base = tasks()
        for m in [m for m in modules.split(",") if m]:
            if not auto:
                importlib.import_module(m)
                continue
            try:
                if importlib.util.find_spec(m) is None:
                    continue  # not installed (a torch 2.x module under torch 1.x): not an error
                importlib.import_module(m)
            except ModuleNotFoundError:
                continue  # its parent or a dependency is not installed
            except BaseException:  # SystemExit too: a module that parses sys.argv
                import traceback
                traceback.print_exc()
                skipped.append(m)
                continue
            why = ""
            if cuda_context():
                why = "created a CUDA context"
            else:
                now = tasks()
                if now[0] > base[0]:
                    why = "started %d thread(s)" % (now[0] - base[0])
                elif now[1] > base[1]:
                    why = "started %d child process(es)" % (now[1] - base[1])
            if why:
                ctl.sendall(("U%s\t%s" % (m, why)).encode("utf-8", "replace"))
                os._exit(0)
        if cuda_context():
            raise RuntimeError("importing %s created a CUDA context; a standby must not hold one" % modules)
    except BaseException as e:
        import traceback
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        try:
            ctl.sendall(b"E" + text.encode("utf-8", "replace"))
        finally:
            traceback.print_exc()
            os._exit(1)
    ctl.sendall(b"R" + ",".join(skipped).encode())

    # Wait for the rank: length, then payload; the fds come with the first bytes.
    fds = []
    buf = b""
    need = 4
    while len(buf) < need:
        data, anc, _, _ = ctl.recvmsg(65536, socket.CMSG_SPACE(8))
        if not data:
            os._exit(0)  # the launcher closed us: nothing to run
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                n = len(cdata) - len(cdata) % 4
                fds.extend(int.from_bytes(cdata[i:i + 4], sys.byteorder) for i in range(0, n, 4))
        buf += data
        if need == 4 and len(buf) >= 4:
            need = 4 + int.from_bytes(buf[:4], "big")
    parts = buf[4:need].split(b"\0")
    cwd = os.fsdecode(parts[0])
    argc = int(parts[1])
    argv = [os.fsdecode(a) for a in parts[2:2 + argc]]
    env = [e for e in parts[2 + argc:] if e]

    # The rank's stdio, environment, directory, signals: as a fresh python -u.
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    for kv in env:
        k, _, v = kv.partition(b"=")
        if k:
            os.environ[os.fsdecode(k)] = os.fsdecode(v)
    for s, h in saved.items():
        if h is not None and _signal.getsignal(s) is not h:
            try:
                _signal.signal(s, h)
            except (OSError, ValueError):
                pass
    _signal.pthread_sigmask(_signal.SIG_SETMASK, saved_mask)
    import io
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "wb", closefd=False)
        new = io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,
                               newline="\n", line_buffering=False, write_through=True)
        raw.name = "<%s>" % name
        new.mode = "w"
        setattr(sys, name, new)
        setattr(sys, "__%s__" % name, new)

    module = argv[2] == "-m"
    target = argv[3] if module else argv[2]
    sys.orig_argv[:] = argv
    sys.path[0] = path0("module" if module else "script", target)
    g = sys.modules["__main__"].__dict__
    g.clear()
    g.update(g0)
    learn = sys.modules.get("_ftl_learn")  # --prewarm auto: report this rank's imports too
    if learn is not None:
        learn.install()
    # The launcher's stacks hook (--ft-rank-stacks) was installed when the
    # standby started (its pid is the rank's); the rank's environment, set
    # again above, names its directory on PYTHONPATH: take it off again.
    stacks = sys.modules.get("_ftl_stacks")
    if stacks is not None:
        stacks.install()
    ctl.sendall(b"S")
    ctl.close()
    del ctl, buf, parts, env, fds, saved, importlib, learn, stacks, skipped

    try:
        if module:
            import runpy
            sys.argv[:] = ["-m"] + argv[4:]
            runpy._run_module_as_main(target, True)
        else:
            sys.argv[:] = argv[2:]
            filename = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
            loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", filename)
            g.update(__file__=filename, __cached__=None, __loader__=loader)
            with open(filename, "rb") as f:
                source = f.read()
            code = compile(source, filename, "exec", dont_inherit=True)
            del source
            exec(code, g)
    except SystemExit:
        raise
    except BaseException as e:
        # Print it as the interpreter would, without this program's frames.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        e.__traceback__ = tb
        sys.excepthook(type(e), e, tb)
        if isinstance(e, KeyboardInterrupt):
            # python exits by SIGINT after finalising on an unhandled one.
            if "threading" in sys.modules:
                sys.modules["threading"]._shutdown()
            import atexit
            atexit._run_exitfuncs()
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
            os.kill(os.getpid(), _signal.SIGINT)
        sys.exit(1)


_ftl_standby(_ftl_g0)
