"""PyTorch Lightning callback: nvrx's FaultToleranceCallback, on this client.

Drop-in for ``nvidia_resiliency_ext.ptl_resiliency.FaultToleranceCallback``
(nvrx removed it from its wheel in v0.6)::

    from ft_launcher_client.lightning import FaultToleranceCallback
    trainer = Trainer(callbacks=[FaultToleranceCallback(autoresume=True,
                                                        calculate_timeouts=True,
                                                        exp_dir=log_dir)])

What it does, as nvrx's does:

* connects to the rank monitor (``RankMonitorClient``) at ``setup`` of the
  ``fit`` stage and disconnects at ``teardown``;
* sends a heartbeat on train start, after every training batch, on train
  end, on validation start, after every validation batch, on validation end,
  and when a checkpoint is saved;
* with ``calculate_timeouts=True``, loads ``<exp_dir>/_ft_state.json`` at
  setup and, once per run, after at least two iterations, a checkpoint load
  and a checkpoint save followed by a heartbeat, computes the heartbeat
  timeouts and rank 0 writes them to that file (so a fresh training first
  has them at the end of its second job);
* with ``autoresume=True``, requires ``FAULT_TOL_FINISHED_FLAG_FILE`` and,
  at teardown, rank 0 creates that file when training is complete:
  ``global_step >= max_steps`` or ``current_epoch >= max_epochs``, or the
  run ended after at most one iteration without a failure (``max_time``
  already spent). A failure (an exception other than ``SystemExit(0)``)
  never creates it.

Unlike nvrx's callback it works on a single device without a process
group: timeouts are computed from this rank's own observations (the
launcher combines ranks itself), and rank 0 is ``trainer.global_rank``, else
``$RANK``, else 0.

Lightning is imported only when this module is (``import ft_launcher_client``
never imports it); without Lightning installed the callback is a plain class
with Lightning's hook names.
"""

import json
import logging
import os
import random
import signal
import threading

from .client import FINISHED_FLAG_ENV, RankMonitorClient

try:  # Lightning 2.x, then the old package name; else duck typing.
    from lightning.pytorch.callbacks import Callback as _Base
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning.callbacks import Callback as _Base
    except ImportError:
        _Base = object

STATE_FILE = "_ft_state.json"
# nvrx needs this many iterations in a run before it computes timeouts.
MIN_ITERS_FOR_TIMEOUTS = 2


class SimulatedFaultParams:
    """nvrx's simulated fault: ``fault_type`` "rank_killed", "rank_hung" or
    "random", on ``rank_to_fail`` (default rank 0),
    ``base_delay`` + uniform(0, ``rand_delay``) seconds after training
    starts."""

    def __init__(self, fault_type="rank_killed", base_delay=0.0, rand_delay=0.0, rank_to_fail=None):
        self.fault_type = fault_type
        self.base_delay = float(base_delay)
        self.rand_delay = float(rand_delay)
        self.rank_to_fail = rank_to_fail


class FaultToleranceCallback(_Base):
    """Heartbeats, computed timeouts and the finished flag for Lightning."""

    def __init__(self, autoresume, calculate_timeouts, simulated_fault_params=None, exp_dir=None,
                 logger_name="nemo_logger.FaultToleranceCallback", inprocess=None):
        if _Base is not object:
            super().__init__()
        self.autoresume = bool(autoresume)
        self.calculate_timeouts = bool(calculate_timeouts)
        self.simulated_fault_params = simulated_fault_params
        self.exp_dir = exp_dir
        self.logger = logging.getLogger(logger_name)
        self.fault_tol_client = None
        self.num_iters_total = 0  # training iterations in this run
        self.loaded_checkpoint = False
        self.saved_checkpoint = False
        self.hb_after_save = False
        self.timeouts_updated = False
        self.failed = False  # a non-graceful exception ended the run
        self._state_dir = None
        self._fault_timer = None
        # inprocess: the ft_launcher_client.inprocess Context of the attempt
        # (Trainer built inside InProcess.run's training function): the
        # callback then uses the API's monitor session instead of its own and
        # ends the fit at a batch when the launcher's notice came
        # (docs/inprocess.md).
        self.inprocess = inprocess

    # -- helpers ---------------------------------------------------------

    @staticmethod
    def _fitting(stage):
        # Lightning passes "fit" (TrainerFn.FITTING is a str enum equal to it).
        return str(getattr(stage, "value", stage)) == "fit"

    @staticmethod
    def _rank(trainer):
        r = getattr(trainer, "global_rank", None)
        if r is None:
            try:
                r = int(os.environ.get("RANK", "0"))
            except ValueError:
                r = 0
        return int(r)

    def _state_path(self):
        return os.path.join(self._state_dir, STATE_FILE)

    def _heartbeat(self):
        if self.fault_tol_client is not None:
            self.fault_tol_client.send_heartbeat()
            if self.saved_checkpoint:
                self.hb_after_save = True

    # -- setup and teardown ----------------------------------------------

    def setup(self, trainer, pl_module, stage):
        if not self._fitting(stage):
            return
        if self.autoresume and not os.environ.get(FINISHED_FLAG_ENV):
            raise RuntimeError(
                "FaultToleranceCallback(autoresume=True) needs %s: the file to create when training is complete"
                % FINISHED_FLAG_ENV)
        self._state_dir = self.exp_dir or os.path.join(getattr(trainer, "log_dir", None) or os.getcwd(), "ft_state")
        if self.inprocess is not None:
            self.fault_tol_client = self.inprocess.monitor  # opened (and reopened) by the API
            return
        self.fault_tol_client = RankMonitorClient()
        if self.calculate_timeouts and os.path.exists(self._state_path()):
            with open(self._state_path()) as f:
                self.fault_tol_client.load_state_dict(json.load(f))
            self.logger.info("fault tolerance: timeouts loaded from %s", self._state_path())
        self.fault_tol_client.init_workload_monitoring()
        hb = self.fault_tol_client.hb_timeouts
        if (not self.calculate_timeouts and hb is not None and self.fault_tol_client._sock is not None
                and (hb.initial is None or hb.subsequent is None)):
            raise RuntimeError("fault tolerance: heartbeat timeouts are not set and calculate_timeouts=False: "
                               "set them in the launcher's configuration or calculate them")

    def teardown(self, trainer, pl_module, stage):
        if not self._fitting(stage):
            return
        if self._fault_timer is not None:
            self._fault_timer.cancel()
        if self.autoresume and self._rank(trainer) == 0 and self._is_training_completed(trainer):
            self._create_finished_flag()
        if self.fault_tol_client is not None:
            self._maybe_update_timeouts(trainer)
            if self.inprocess is None:
                self.fault_tol_client.shutdown_workload_monitoring()
            self.fault_tol_client = None

    def on_exception(self, trainer, pl_module, exception):
        # SystemExit(0) is a clean stop (a signal handler, a time limit).
        if isinstance(exception, SystemExit) and exception.code in (0, None):
            return
        self.failed = True

    # -- heartbeats ------------------------------------------------------

    def on_train_start(self, trainer, pl_module):
        self._heartbeat()
        self._maybe_arm_simulated_fault(trainer)

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs):
        self.num_iters_total += 1
        if self.inprocess is not None:
            # The heartbeat through the API, which also reports the first
            # step after an in-process restart (the launcher's restart is
            # complete only with every survivor's first step).
            self.inprocess.step(check=False)
            if self.saved_checkpoint:
                self.hb_after_save = True
        else:
            self._heartbeat()
        self._maybe_update_timeouts(trainer)
        if self.inprocess is not None:
            self.inprocess.check()  # RestartNotice ends the fit; InProcess.run rejoins

    def on_train_end(self, trainer, pl_module):
        self._heartbeat()

    def on_validation_start(self, trainer, pl_module):
        self._heartbeat()

    def on_validation_batch_end(self, trainer, pl_module, *args, **kwargs):
        self._heartbeat()

    def on_validation_end(self, trainer, pl_module):
        self._heartbeat()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self.loaded_checkpoint = True

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.saved_checkpoint = True
        self.hb_after_save = False
        self._heartbeat()

    # -- timeouts and the finished flag -----------------------------------

    def _maybe_update_timeouts(self, trainer):
        if (not self.calculate_timeouts or self.timeouts_updated or self.failed
                or self.num_iters_total < MIN_ITERS_FOR_TIMEOUTS or not self.loaded_checkpoint
                or not self.hb_after_save or self.fault_tol_client is None):
            return
        if not self.fault_tol_client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):
            return
        self.timeouts_updated = True
        if self._rank(trainer) == 0:
            os.makedirs(self._state_dir, exist_ok=True)
            tmp = self._state_path() + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.fault_tol_client.state_dict(), f)
            os.replace(tmp, self._state_path())
            self.logger.info("fault tolerance: timeouts %s written to %s",
                             vars(self.fault_tol_client.hb_timeouts), self._state_path())

    def _is_training_completed(self, trainer):
        if self.failed:
            return False
        max_steps = getattr(trainer, "max_steps", None)
        if max_steps is not None and max_steps > 0 and getattr(trainer, "global_step", 0) >= max_steps:
            return True
        max_epochs = getattr(trainer, "max_epochs", None)
        if max_epochs is not None and max_epochs > 0 and getattr(trainer, "current_epoch", 0) >= max_epochs:
            return True
        # nvrx: a run that ends after at most one iteration without a
        # failure found its time budget (max_time) already spent.
        return self.num_iters_total <= 1

    def _create_finished_flag(self):
        path = os.environ[FINISHED_FLAG_ENV]
        with open(path, "a"):
            os.utime(path, None)
        self.logger.info("fault tolerance: training complete, %s created", path)

    def _maybe_arm_simulated_fault(self, trainer):
        p = self.simulated_fault_params
        if p is None:
            return
        if isinstance(p, dict):
            p = SimulatedFaultParams(**p)
        target = p.rank_to_fail if p.rank_to_fail is not None else 0
        if self._rank(trainer) != int(target):
            return
        kind = p.fault_type
        if kind == "random":
            kind = random.choice(["rank_killed", "rank_hung"])
        sig = signal.SIGKILL if kind == "rank_killed" else signal.SIGSTOP
        delay = p.base_delay + random.uniform(0, p.rand_delay)
        self.logger.warning("fault tolerance: simulated fault %s on rank %s in %.1fs", kind, target, delay)
        self._fault_timer = threading.Timer(delay, os.kill, (os.getpid(), sig))
        self._fault_timer.daemon = True
        self._fault_timer.start()


__all__ = ["FaultToleranceCallback", "SimulatedFaultParams", "STATE_FILE"]
