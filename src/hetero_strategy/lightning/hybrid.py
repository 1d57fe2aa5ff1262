"""HeteroStrategy's wiring of ``mode="hybrid"`` (local-SGD phases) to Lightning's loop.

Everything here reads Lightning objects and forwards to the runtime's hybrid events
(:mod:`hetero_strategy.runtime.hybrid_events`); the protocol itself lives in
:mod:`hetero_strategy.hybrid`. Where each event comes from:

=========================  ============================================================
runtime event              Lightning point
=========================  ============================================================
``local_step(ddp)``        around Lightning's closure (training_step's forward + backward)
``before_optimizer_step``  at the end of the closure, before ``optimizer.step`` updates
``step_end``               after the optimizer step (HeteroStrategy.optimizer_step)
``join``                   after the step of the epoch's last batch, or of ``max_steps``
``evaluated(value)``       at validation end: ``trainer.callback_metrics[hybrid_monitor]``
=========================  ============================================================

Every rank runs the same number of batches per epoch (the hetero sampler), so ``global_step``
agrees at each epoch's end; within an epoch a fast rank runs ahead, which is why whatever
Lightning would do as a collective mid-epoch (validation, step-based checkpoints, synced logs)
is refused at setup instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn

from hetero_strategy.config import ConfigError

__all__ = ["HybridLoop", "check_hybrid_monitor", "check_hybrid_trainer", "local_closure", "local_sigterm_check",
           "monitored_value", "refuse_synced_log", "training_stops_here"]


class HybridLoop:
    """Mixin of HeteroStrategy (before DDPStrategy): the hybrid events from Lightning's hooks.
    Needs ``runtime``, ``model``, ``hybrid_monitor``, ``_trainer()`` and ``_log_metrics``; all
    no-ops in mode="sync"."""

    in_batch = False  # inside a training batch: no synced logs there in a local phase

    def setup_hybrid(self, trainer: Any) -> None:
        if self.runtime.hybrid is not None:
            check_hybrid_trainer(trainer)
            local_sigterm_check(trainer, self.runtime)
            from lightning.pytorch.utilities.model_helpers import is_overridden

            if not is_overridden("validation_step", trainer.lightning_module):
                self.runtime.info_warning(f"hetero: mode='hybrid' without a validation_step: nothing feeds the phase "
                                          f"schedule, so training stays in phase 0 (sync period "
                                          f"{self.runtime.hybrid.schedule.period}) to the end; log "
                                          f"{self.hybrid_monitor!r} in validation_step to move on")

    def hybrid_closure(self, closure: Callable[[], Any], optimizer: Any) -> Callable[[], Any]:
        return closure if self.runtime.hybrid is None else local_closure(closure, optimizer, self.model, self.runtime)

    def hybrid_step_end(self, trainer: Any) -> None:
        """After the optimizer step (and its step_end): the join where this rank's training stops."""
        if self.runtime.hybrid is not None and trainer is not None and training_stops_here(trainer):
            # NOTE: here, not in an epoch-end hook: Lightning's epoch end runs collectives of its own
            self.runtime.join()
            self._log_metrics(trainer)
        self.in_batch = False

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        refuse_synced_log(self.runtime, self.in_batch)
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def on_validation_end(self) -> None:
        super().on_validation_end()
        trainer = self._trainer()
        if (self.runtime.hybrid is not None and trainer is not None and not trainer.sanity_checking
                and trainer.state.fn == TrainerFn.FITTING):
            self.runtime.evaluated(monitored_value(trainer, self.hybrid_monitor))


def check_hybrid_monitor(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"hybrid_monitor={value!r} is invalid: give the key your validation_step logs, e.g. "
                          "hybrid_monitor='val_loss' with self.log('val_loss', loss) (the phase schedule reads it "
                          "at every validation end)")


def check_hybrid_trainer(trainer: Any) -> None:
    """Refuse what would run a collective mid-epoch, where hybrid ranks stand at different steps."""
    interval = trainer.val_check_interval
    # NOTE: a float is a fraction of the epoch, an int a number of batches, a duration a wall time
    at_epoch_end = isinstance(interval, float) and interval == 1.0
    if trainer.check_val_every_n_epoch is None or getattr(trainer, "_val_check_time_interval", None) is not None \
            or not at_epoch_end:
        raise ConfigError(f"val_check_interval={interval!r} (check_val_every_n_epoch="
                          f"{trainer.check_val_every_n_epoch!r}) is invalid with mode='hybrid': in local-SGD phases "
                          "the ranks stand at different steps mid-epoch, so validation runs at epoch ends only; use "
                          "val_check_interval=1.0 and check_val_every_n_epoch=N (shorter epochs validate more often)")
    from lightning.pytorch.callbacks import ModelCheckpoint

    for cb in trainer.callbacks:
        if not isinstance(cb, ModelCheckpoint):
            continue
        for name in ("every_n_train_steps", "train_time_interval"):
            value = getattr(cb, f"_{name}", None)
            if value:  # 0 / None: off
                raise ConfigError(f"ModelCheckpoint({name}={value!r}) is invalid with mode='hybrid': mid-epoch the "
                                  "ranks' models and step counts differ, so a save would deadlock or mix models; "
                                  "save at epoch or validation ends: ModelCheckpoint(every_n_epochs=1) or "
                                  "ModelCheckpoint(monitor=...)")
    from lightning.pytorch.callbacks import Timer

    for cb in trainer.callbacks:
        if isinstance(cb, Timer) and cb._duration is not None and cb._interval == "step":
            raise ConfigError(f"max_time={cb._duration:g} s (Timer(interval='step')) is invalid with mode='hybrid': it "
                              "broadcasts rank 0's clock after every batch, which ranks at different steps cannot "
                              "all reach; use Trainer(callbacks=[Timer(duration=..., interval='epoch')]) instead")
    if not trainer.lightning_module.automatic_optimization:
        raise ConfigError("automatic_optimization=False is invalid with mode='hybrid': HeteroStrategy wraps "
                          "Lightning's closure (forward and backward) to keep local steps off DDP's gradient "
                          "exchange; use automatic optimization, or mode='sync'")


def local_sigterm_check(trainer: Any, runtime: Any) -> None:
    """Keep Lightning's per-batch SIGTERM broadcast out of local phases.

    NOTE: Lightning 2.6 broadcasts a SIGTERM flag from rank 0 before every training batch
    (``_TrainingEpochLoop._broadcast_sigterm_tensor``): a per-step collective that would hold a
    fast rank to the slow one's pace and interleave with the period's sync collectives. In a local
    phase each rank checks its own flag instead (a SIGTERM reaches every rank of a job); in the
    synchronous phase Lightning's broadcast stays.
    """
    loop = trainer.fit_loop.epoch_loop
    broadcast = getattr(loop, "_broadcast_sigterm_tensor", None)
    if broadcast is None or getattr(broadcast, "_hetero", False):
        return

    def check() -> None:
        if runtime.hybrid is None or not runtime.hybrid.local:
            return broadcast()
        if getattr(trainer, "received_sigterm", False):
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            raise SIGTERMException()
        return None

    check._hetero = True
    loop._broadcast_sigterm_tensor = check


def local_closure(closure: Callable[[], Any], optimizer: Any, ddp_model: Any, runtime: Any) -> Callable[[], Any]:
    """Lightning's closure (training_step, backward) as one local step: without DDP's gradient
    exchange in a local phase, then the local clipping before the optimizer updates."""

    def run() -> Any:
        with runtime.local_step(ddp_model):
            out = closure()
        runtime.before_optimizer_step(optimizer)
        return out

    return run


def training_stops_here(trainer: Any) -> bool:
    """During optimizer_step: this rank's epoch (its last batch) or the run (``max_steps``) ends with it."""
    loop = trainer.fit_loop.epoch_loop
    # NOTE: global_step counts completed steps; the current one completes after optimizer_step
    max_steps = trainer.max_steps
    return loop._num_ready_batches_reached() or (max_steps is not None and 0 <= max_steps <= trainer.global_step + 1)


def monitored_value(trainer: Any, key: str) -> float:
    """``trainer.callback_metrics[key]`` at validation end, or a ConfigError naming what was logged."""
    value = trainer.callback_metrics.get(key)
    if value is None:
        logged = sorted(trainer.callback_metrics) or "nothing"
        raise ConfigError(f"hybrid_monitor={key!r} is invalid: validation logged {logged}, and the hybrid phase "
                          f"schedule needs a loss: self.log({key!r}, loss) in validation_step, or "
                          "HeteroStrategy(hybrid_monitor=<a key it logs>)")
    return float(value)


def refuse_synced_log(runtime: Any, in_batch: bool) -> None:
    """``self.log(..., sync_dist=True)`` inside a training batch of a local phase: a per-step
    all-reduce the ranks reach at different times (and after unequal numbers of steps). Every rank
    refuses alike, at its first such log."""
    hybrid = runtime.hybrid
    if hybrid is not None and hybrid.local and in_batch:
        raise ConfigError("self.log(..., sync_dist=True) in training_step is invalid with mode='hybrid': in "
                          "local-SGD phases the ranks take unequal numbers of steps, so a per-step all-reduce "
                          "deadlocks; log with sync_dist=False (or on_step=False, on_epoch=True: reduced at the "
                          "epoch's end, where the ranks meet)")
