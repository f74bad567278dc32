"""A stand-in for PyTorch Lightning's Trainer, for tests only.

Lightning does not install on the CI machine, so the callback is tested
against this: a trainer that calls the callback hooks Lightning 2.x calls,
with the same names, arguments and order for ``fit``: ``setup("fit")``,
``on_load_checkpoint`` when resuming, ``on_train_start``, per batch
``on_train_batch_start``/``on_train_batch_end``, per epoch the validation
hooks and ``on_save_checkpoint``, ``on_train_end``, ``teardown("fit")``. On an
exception it calls ``on_exception`` and re-raises without ``teardown`` (as
Lightning 2.x's ``_call_and_handle_interrupt`` does). It has the attributes
the callback reads: ``global_step``, ``current_epoch``, ``max_steps``,
``max_epochs``, ``global_rank``, ``log_dir``.
"""

import json
import os
import time


class Trainer:
    def __init__(self, callbacks, max_steps=-1, max_epochs=None, batches_per_epoch=4, val_batches=2,
                 global_rank=None, log_dir=None, stop_after_steps=None, fail_at_step=None,
                 batch_sleep=0.0, hang_at_step=None, hang_for=0.0):
        self.callbacks = list(callbacks)
        self.max_steps = max_steps
        self.max_epochs = max_epochs
        self.batches_per_epoch = batches_per_epoch
        self.val_batches = val_batches
        if global_rank is not None:  # absent: a single device without a process group
            self.global_rank = global_rank
        self.log_dir = log_dir
        self.stop_after_steps = stop_after_steps  # like max_time: stop cleanly early
        self.fail_at_step = fail_at_step
        self.batch_sleep = batch_sleep
        self.hang_at_step = hang_at_step
        self.hang_for = hang_for
        self.global_step = 0
        self.current_epoch = 0
        self.should_stop = False

    def _call(self, hook, *args):
        for cb in self.callbacks:
            fn = getattr(cb, hook, None)
            if fn is not None:
                fn(self, None, *args)

    def fit(self, model=None, ckpt_path=None):
        self._call("setup", "fit")
        try:
            self._fit(ckpt_path)
        except BaseException as e:
            self._call("on_exception", e)
            raise
        self._call("teardown", "fit")

    def _fit(self, ckpt_path):
        if ckpt_path and os.path.exists(ckpt_path):
            with open(ckpt_path) as f:
                ckpt = json.load(f)
            self.global_step, self.current_epoch = ckpt["global_step"], ckpt["epoch"]
            self._call("on_load_checkpoint", ckpt)
        self._call("on_train_start")
        steps_this_run = 0
        while not self._done():
            for batch_idx in range(self.batches_per_epoch):
                if self._done() or self.should_stop:
                    break
                self._call("on_train_batch_start", batch_idx, batch_idx)
                if self.fail_at_step is not None and self.global_step == self.fail_at_step:
                    raise RuntimeError("simulated failure at step %d" % self.global_step)
                if self.hang_at_step is not None and self.global_step == self.hang_at_step:
                    time.sleep(self.hang_for)
                time.sleep(self.batch_sleep)
                self.global_step += 1
                steps_this_run += 1
                self._call("on_train_batch_end", {"loss": 0.0}, batch_idx, batch_idx)
                if self.stop_after_steps is not None and steps_this_run >= self.stop_after_steps:
                    self.should_stop = True
            self._call("on_validation_start")
            for i in range(self.val_batches):
                self._call("on_validation_batch_end", {"val": 0.0}, i, i)
            self._call("on_validation_end")
            if not self.should_stop:
                self.current_epoch += 1
            ckpt = {"global_step": self.global_step, "epoch": self.current_epoch}
            self._call("on_save_checkpoint", ckpt)
            if ckpt_path:
                tmp = ckpt_path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(ckpt, f)
                os.replace(tmp, ckpt_path)
            if self.should_stop:
                break
        self._call("on_train_end")

    def _done(self):
        if self.max_steps is not None and self.max_steps > 0 and self.global_step >= self.max_steps:
            return True
        return self.max_epochs is not None and self.max_epochs > 0 and self.current_epoch >= self.max_epochs
