"""Uncaught exceptions, as Python prints them.

usage: python tracebacks.py MODE
  forward:   RuntimeError raised in a user nn.Module.forward called through torch's Module.__call__
  progress:  a \\r progress bar on stderr, then an uncaught ValueError (no newline before "Traceback")
  context:   KeyError handled, RuntimeError raised while handling ("During handling ...")
  cause:     raise ... from ... twice (3 exceptions, 2 links)
  group:     ExceptionGroup with two sub-exceptions
  syntax:    import of a module with a syntax error
  multiline: exception with a multi-line message
  keyboard:  KeyboardInterrupt (no message)
  recursion: RecursionError ("[Previous line repeated N more times]")
  untraced:  raise ... from an exception that was never raised (the cause has no traceback)
  dataloader: an exception in a DataLoader worker process, re-raised in the main process
"""
import os
import sys
import tempfile


def forward_mode():
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            if not torch.isfinite(y).all() or True:
                raise RuntimeError("loss is NaN at step 3 (rank 0)")
            return y

    def train_step(model, x):
        return model(x).sum()

    model = Net()
    for step in range(5):
        train_step(model, torch.ones(2, 4))


def progress_mode():
    for i in range(1, 6):
        sys.stderr.write("\rtrain:  %3d%%|%-10s| %d/10 [00:0%d<00:05]" % (i * 10, "#" * i, i, i))
        sys.stderr.flush()
    raise ValueError("bad batch shape (2, 3)")


def load(cfg, key):
    return cfg[key]


def context_mode():
    cfg = {"lr": 0.1}
    try:
        load(cfg, "batch_size")
    except KeyError:
        raise RuntimeError("config is missing batch_size")


def open_ckpt(path):
    return open(path, "rb")


def cause_mode():
    try:
        try:
            open_ckpt("/nonexistent/ckpt.pt")
        except OSError as e:
            raise ValueError("cannot read checkpoint") from e
    except ValueError as e:
        raise RuntimeError("resume failed") from e


def group_mode():
    errors = []
    for rank, exc in ((1, ValueError("rank 1 diverged")), (3, TypeError("rank 3 bad dtype"))):
        try:
            raise exc
        except Exception as e:
            errors.append(e)
    raise ExceptionGroup("2 ranks failed", errors)


def syntax_mode():
    d = tempfile.mkdtemp(prefix="pytrace-syn-")
    with open(os.path.join(d, "badmod.py"), "w") as f:
        f.write("def f(x):\n    return x +* 2\n")
    sys.path.insert(0, d)
    import badmod  # noqa: F401


def multiline_mode():
    raise RuntimeError("NCCL communicator was aborted on rank 2.\n"
                       "Last error:\n"
                       "  socket timeout after 1800000 ms")


def keyboard_mode():
    raise KeyboardInterrupt


def rec(n):
    return rec(n + 1)


def recursion_mode():
    rec(0)


def untraced_mode():
    raise RuntimeError("rendezvous failed") from TimeoutError("store timed out after 300s")


class BadDataset:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise IndexError("sample 5 is corrupt")
        return i


def dataloader_mode():
    import torch.utils.data

    loader = torch.utils.data.DataLoader(BadDataset(), batch_size=2, num_workers=1)
    for batch in loader:
        print("batch", batch.tolist(), file=sys.stderr)


if __name__ == "__main__":
    globals()[sys.argv[1] + "_mode"]()
