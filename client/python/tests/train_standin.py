"""A training run of the stand-in trainer with FaultToleranceCallback, for
tests under a real ft-launcher: python3 train_standin.py EXP_DIR CKPT
MAX_STEPS [STOP_AFTER] [HANG_AT]."""

import logging
import sys

from standin import Trainer

from ft_launcher_client import FaultToleranceCallback

logging.basicConfig(level=logging.INFO)
exp_dir, ckpt, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
stop_after = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "-" else None
hang_at = int(sys.argv[5]) if len(sys.argv) > 5 else None
cb = FaultToleranceCallback(autoresume=True, calculate_timeouts=True, exp_dir=exp_dir)
trainer = Trainer([cb], max_steps=max_steps, batches_per_epoch=3, batch_sleep=0.2,
                  stop_after_steps=stop_after, hang_at_step=hang_at, hang_for=300)
trainer.fit(ckpt_path=ckpt)
print("trained to step", trainer.global_step, "timeouts", vars(cb.fault_tol_client.hb_timeouts) if cb.fault_tol_client else None)
