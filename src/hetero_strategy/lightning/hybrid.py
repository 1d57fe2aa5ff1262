"""HeteroStrategy's wiring of ``mode="hybrid"`` (local-SGD phases) to Lightning's loop.

HeteroStrategy holds one :class:`HybridLoop`: its ``setup``, ``optimizer_step`` and ``reduce``
call it. Everything here reads Lightning objects and forwards to the runtime's hybrid events
(:class:`~hetero_strategy.runtime.HeteroRuntime`, whose mode is :mod:`hetero_strategy.runtime.training_mode`); the protocol lives in
:mod:`hetero_strategy.hybrid`. Where each event comes from:

=========================  ============================================================
runtime event              Lightning point
=========================  ============================================================
``local_step(ddp)``        around Lightning's closure (training_step's forward + backward)
``before_optimizer_step``  on_before_optimizer_step (HybridCallback): after the precision
                           plugin unscaled fp16 gradients, before ``gradient_clip_val``
``step_end``               after the optimizer step (HeteroStrategy.optimizer_step)
``join``                   after the step of the epoch's last batch, or of ``max_steps``
``evaluated(value)``       on_validation_end (HybridCallback), before the other callbacks'
                           (ModelCheckpoint saves there): ``callback_metrics[hybrid_monitor]``
=========================  ============================================================

HybridCallback is first in ``trainer.callbacks``: Lightning runs callbacks' hooks before the
module's and the strategy's, and a checkpoint written at a validation end must already hold that
evaluation's phase (and, at a switch, the averaged optimizer state).

Every rank runs the same number of batches per epoch (the hetero sampler), so ``global_step``
agrees at each epoch's end; within an epoch a fast rank runs ahead, which is why whatever
Lightning would do as a collective mid-epoch (validation, step-based checkpoints, synced logs)
is refused at setup instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from hetero_strategy.config import ConfigError
from hetero_strategy.lightning.internals import local_sigterm, require_lightning_internals

__all__ = ["HybridCallback", "HybridLoop", "check_hybrid_monitor", "check_hybrid_trainer", "in_training_batch",
           "local_closure", "monitored_value", "refuse_synced_log", "training_stops_here"]


class HybridCallback(Callback):
    """The runtime's hybrid events that Lightning offers as callback hooks (HybridLoop.setup puts
    it first in ``trainer.callbacks``).

    Args:
        runtime: the run's HeteroRuntime (a fit's setup installs a new callback with its runtime).
        monitor: the key whose validation value feeds the phase schedule (``hybrid_monitor``).
    """

    def __init__(self, runtime: Any, monitor: str) -> None:
        self.runtime = runtime
        self.monitor = monitor

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        # NOTE: after the closure and after MixedPrecision unscaled the gradients (plugins/precision/amp.py):
        # clipping at the closure's end would act on fp16-scaled gradients
        self.runtime.before_optimizer_step(optimizer)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        # NOTE: Lightning raises SIGTERMException right after this batch on a rank that got the
        # signal; joining first keeps a peer that already entered the period's sync from waiting
        # for a rank that is gone (every signalled rank meets in the join)
        if trainer.received_sigterm:
            self._join_if_apart()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._join_if_apart()  # an epoch cut short (should_stop, on_train_batch_start returning -1)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and trainer.state.fn == TrainerFn.FITTING:
            self._join_if_apart()

    def _join_if_apart(self) -> None:
        # NOTE: not "if not synced": a rank that just ended a period is synced while its peer is not;
        # join() itself does nothing where every rank already joined with no local step since
        self.runtime.join()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking and trainer.state.fn == TrainerFn.FITTING:
            self.runtime.evaluated(monitored_value(trainer, self.monitor))


class HybridLoop:
    """The ``mode="hybrid"`` part HeteroStrategy holds: what the strategy's ``setup``,
    ``optimizer_step`` and ``reduce`` add in local-SGD phases; each is a no-op in mode="sync".
    Every method takes the strategy's current runtime (each run of a Trainer builds a new one).

    Args:
        monitor: the key ``validation_step`` logs whose value feeds the phase schedule.
    """

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor  # checked with the strategy's other keywords (lightning.options)

    def setup(self, trainer: Any, runtime: Any) -> None:
        """Refuse what would deadlock mid-epoch, keep SIGTERM local, put HybridCallback first."""
        # NOTE: fit only: validate/test/predict take no local steps, so nothing here applies to them
        if runtime.hybrid is None or trainer.state.fn != TrainerFn.FITTING:
            return
        require_lightning_internals(trainer)
        check_hybrid_trainer(trainer)
        local_sigterm(trainer)
        trainer.callbacks[:] = [HybridCallback(runtime, self.monitor)] + [
            cb for cb in trainer.callbacks if not isinstance(cb, HybridCallback)]
        from lightning.pytorch.utilities.model_helpers import is_overridden

        if not is_overridden("validation_step", trainer.lightning_module):
            runtime.info_warning(f"hetero: mode='hybrid' without a validation_step: nothing feeds the phase "
                                 f"schedule, so training stays in phase 0 (sync period "
                                 f"{runtime.hybrid.schedule.period}) to the end; log "
                                 f"{self.monitor!r} in validation_step to move on")

    def closure(self, closure: Callable[[], Any], ddp_model: Any, runtime: Any) -> Callable[[], Any]:
        """Lightning's closure, as a local step in mode="hybrid"."""
        return closure if runtime.hybrid is None else local_closure(closure, ddp_model, runtime)

    def join_if_done(self, trainer: Any, runtime: Any) -> bool:
        """After the optimizer step (and its step_end): the join where this rank's training stops;
        True when it joined."""
        if runtime.hybrid is None or trainer is None or not training_stops_here(trainer):
            return False
        # NOTE: here, not in an epoch-end hook: Lightning's epoch end runs collectives of its own
        runtime.join()
        return True

    def check_reduce(self, trainer: Any, runtime: Any) -> None:
        """Before Lightning's ``reduce``: refuse a synced log inside a local phase's training batch."""
        refuse_synced_log(runtime, in_training_batch(trainer))


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
    if trainer.check_val_every_n_epoch is None or trainer._val_check_time_interval is not None \
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
            value = getattr(cb, f"_{name}")  # present: require_lightning_internals
            # NOTE: every_n_train_steps=0 is off, but any train_time_interval, timedelta(0) too, is
            # on: Lightning then broadcasts rank 0's clock after every batch (model_checkpoint.py)
            if (value is not None) if name == "train_time_interval" else bool(value):
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
    from lightning.fabric.plugins.environments import SLURMEnvironment

    env = getattr(trainer.strategy, "cluster_environment", None)
    if isinstance(env, SLURMEnvironment) and env.auto_requeue:
        raise ConfigError("SLURMEnvironment(auto_requeue=True) is invalid with mode='hybrid': its signal handler "
                          "saves a checkpoint wherever each rank happens to be, and mid-period the ranks' models "
                          "differ; pass plugins=[SLURMEnvironment(auto_requeue=False)] and save at epoch ends "
                          "(ModelCheckpoint(every_n_epochs=1))")
    if not trainer.lightning_module.automatic_optimization:
        raise ConfigError("automatic_optimization=False is invalid with mode='hybrid': HeteroStrategy wraps "
                          "Lightning's closure (forward and backward) to keep local steps off DDP's gradient "
                          "exchange; use automatic optimization, or mode='sync'")


def local_closure(closure: Callable[[], Any], ddp_model: Any, runtime: Any) -> Callable[[], Any]:
    """Lightning's closure (training_step, backward) as one local step: without DDP's gradient
    exchange in a local phase (the clipping follows in HybridCallback.on_before_optimizer_step)."""

    def run() -> Any:
        with runtime.local_step(ddp_model):
            return closure()

    return run


def training_stops_here(trainer: Any) -> bool:
    """During optimizer_step: this rank's epoch (its last batch) or the run (``max_steps``) ends with it."""
    loop = trainer.fit_loop.epoch_loop
    # NOTE: global_step counts completed steps; the current one completes after optimizer_step
    max_steps = trainer.max_steps
    return loop._num_ready_batches_reached() or (max_steps is not None and 0 <= max_steps <= trainer.global_step + 1)


def in_training_batch(trainer: Any) -> bool:
    """From a training batch's arrival (before any on_train_batch_start) to the end of its
    on_train_batch_end hooks: the span where a rank of a local phase is at its own step."""
    if trainer is None or not trainer.training:  # NOTE: False in a validation run inside fit
        return False
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    return current.ready > current.completed


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
        raise ConfigError("self.log(..., sync_dist=True) inside a training batch (training_step, on_train_batch_start/"
                          "end, on_before/after_backward ...) is invalid with mode='hybrid': in local-SGD phases "
                          "the ranks take unequal numbers of steps, so a per-batch all-reduce "
                          "deadlocks; log with sync_dist=False (or on_step=False, on_epoch=True: reduced at the "
                          "epoch's end, where the ranks meet)")
