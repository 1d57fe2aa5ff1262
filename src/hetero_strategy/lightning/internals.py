"""The private Lightning attributes ``mode="hybrid"`` reads or replaces, checked loudly at setup.

NOTE: written against Lightning 2.6. A private name Lightning renames would otherwise make a
``getattr(obj, name, default)`` quietly fall back: a step-based checkpoint no longer refused, a
SIGTERM broadcast left inside local phases (a per-step collective that deadlocks there). So
:func:`require_lightning_internals` raises a RuntimeError naming the attribute and the version.

SIGTERM in a local phase (:func:`local_sigterm`): Lightning 2.6 broadcasts a SIGTERM flag from rank
0 twice: before every training batch (``_TrainingEpochLoop._broadcast_sigterm_tensor``) and inside
the signal handler itself (``_SignalConnector._sigterm_notifier_fn``). With unequal step counts
either broadcast can pair with a period's sync collective on another rank. In a local phase each
rank only records its own signal (a SIGTERM reaches every rank of a job) and stops at its own next
batch with Lightning's ``SIGTERMException``; the synchronous phase keeps Lightning's broadcasts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["local_sigterm", "require_lightning_internals"]

_VERSION_NOTE = "HeteroStrategy(mode='hybrid') is written against Lightning 2.6"


def _require(obj: Any, names: tuple[str, ...], where: str) -> None:
    import lightning

    for name in names:
        if not hasattr(obj, name):
            raise RuntimeError(f"hetero: {where}.{name} is missing in Lightning {lightning.__version__}: "
                               f"{_VERSION_NOTE}, whose private {where}.{name} it reads to keep collectives out "
                               "of local-SGD phases; install lightning 2.6 (pip install 'lightning>=2.6,<2.7') "
                               "or use mode='sync'")


def require_lightning_internals(trainer: Any) -> None:
    """Every private attribute the hybrid wiring reads, on this trainer and its callbacks."""
    from lightning.pytorch.callbacks import ModelCheckpoint, Timer

    _require(trainer, ("_val_check_time_interval", "received_sigterm", "_signal_connector"), "Trainer")
    _require(trainer._signal_connector, ("_sigterm_notifier_fn", "received_sigterm"), "_SignalConnector")
    _require(trainer.fit_loop.epoch_loop, ("_broadcast_sigterm_tensor", "_num_ready_batches_reached",
                                           "batch_progress"), "_TrainingEpochLoop")
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint):
            _require(cb, ("_every_n_train_steps", "_train_time_interval"), "ModelCheckpoint")
        if isinstance(cb, Timer):
            _require(cb, ("_duration", "_interval"), "Timer")


def local_sigterm(trainer: Any) -> None:
    """In local phases, no SIGTERM broadcast: neither per batch nor in the signal handler.
    Call after :func:`require_lightning_internals` (at setup, before Lightning registers its handlers)."""
    loop = trainer.fit_loop.epoch_loop
    if not getattr(loop._broadcast_sigterm_tensor, "_hetero", False):
        loop._broadcast_sigterm_tensor = _local_check(trainer, loop._broadcast_sigterm_tensor)
    connector = trainer._signal_connector
    if not getattr(connector._sigterm_notifier_fn, "_hetero", False):
        # NOTE: an instance attribute: Lightning registers self._sigterm_notifier_fn after strategy.setup
        connector._sigterm_notifier_fn = _local_notifier(trainer, connector._sigterm_notifier_fn)


def _local(trainer: Any) -> bool:
    hybrid = trainer.strategy.runtime.hybrid  # NOTE: read per call: each fit sets up a new runtime
    return hybrid is not None and hybrid.local


def _local_check(trainer: Any, broadcast: Any) -> Any:
    def check() -> None:
        if not _local(trainer):
            return broadcast()
        if trainer.received_sigterm:
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            raise SIGTERMException()
        return None

    check._hetero = True
    return check


def _local_notifier(trainer: Any, notify: Any) -> Any:
    connector = trainer._signal_connector

    def notifier(signum: Any, frame: Any) -> None:
        if not _local(trainer):
            return notify(signum, frame)
        # Lightning's handler without its broadcast: stop the launched children once, record the signal
        if not connector.received_sigterm and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)
        connector.received_sigterm = True
        return None

    notifier._hetero = True
    return notifier
