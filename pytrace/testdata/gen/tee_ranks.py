"""Run gloo_exit.py as 2 ranks through torch.distributed.elastic's start_processes
with tee=Std.ALL, i.e. exactly the "[default0]:" console prefixing torchrun --tee 3
does (Debian's torchrun 1.13 CLI cannot parse --tee under Python 3.11).

usage: python tee_ranks.py PORT > console.txt 2>&1
"""
import os
import sys
import tempfile

from torch.distributed.elastic.multiprocessing import Std, start_processes

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    port = sys.argv[1]
    script = os.path.join(HERE, "gloo_exit.py")
    log_dir = tempfile.mkdtemp(prefix="pytrace-tee-")
    ctx = start_processes(
        name="default",
        entrypoint=sys.executable,
        args={0: (script, "0", port), 1: (script, "1", port)},
        envs={0: {"PYTHONUNBUFFERED": "1"}, 1: {"PYTHONUNBUFFERED": "1"}},
        log_dir=log_dir,
        redirects=Std.ALL,
        tee=Std.ALL,
    )
    result = ctx.wait(timeout=90)
    ctx.close()
    print("exit codes: %s" % (result.return_values if result is None else {k: v.exitcode for k, v in result.failures.items()}))


if __name__ == "__main__":
    main()
