"""A real Lightning Trainer (strategy "ddp", CPU/gloo) under
ft-launcher --restart-mode in-process, with FaultToleranceCallback(inprocess=ctx).

Lightning does not install on the development machine, so this runs where it
does (the GPU machine, bench/gpu/run.sh). Rank 1 crashes (os._exit(1)) at
global step 12 of round 0; rank 0 must stay in its process, rejoin, build a
new Trainer and resume from the step-10 checkpoint to step 30. Every call of
the training function appends "<round> <rank> <pid> <start step>" to
OUTDIR/calls; rank 0 writes OUTDIR/result.json at the end.

usage: ft-launcher --nproc-per-node 2 --restart-mode in-process lightning_inprocess.py OUTDIR
"""
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(_HERE, "..", "..", "client", "python")))

import torch  # noqa: E402

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from ft_launcher_client.inprocess import InProcess  # noqa: E402
from ft_launcher_client.lightning import FaultToleranceCallback  # noqa: E402

OUT = sys.argv[1]
CKPT = os.path.join(OUT, "ckpt")
MAX_STEPS, CRASH_AT = 30, 12


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, _):
        if (self.trainer.global_step == CRASH_AT and os.environ.get("RANK") == "1"
                and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
            sys.stdout.flush()
            os._exit(1)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)


def train(ctx):
    last = os.path.join(CKPT, "last.ckpt")
    start = last if os.path.exists(last) else None
    with open(os.path.join(OUT, "calls"), "a") as f:
        f.write("%s %s %d %s\n" % (os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"], os.getpid(), start))
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=CKPT, every_n_train_steps=5, save_last=True, save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=1,
                         strategy="ddp", max_steps=MAX_STEPS, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=OUT,
                         callbacks=[ckpt, FaultToleranceCallback(False, False, inprocess=ctx)])
    trainer.fit(Model(), data(), ckpt_path=start)
    return trainer.global_step


ip = InProcess(backend="gloo")
step = ip.run(train)
if os.environ["RANK"] == "0":
    with open(os.path.join(OUT, "result.json"), "w") as f:
        json.dump({"global_step": step, "pid": os.getpid(), "lightning": pl.__version__,
                   "torch": torch.__version__}, f)
ip.close()
sys.stdout.flush()
os._exit(0)
