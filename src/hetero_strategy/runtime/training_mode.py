"""What the runtime asks of its training mode: the hybrid mode's events, or their no-ops.

:class:`~hetero_strategy.runtime.HeteroRuntime` holds one :class:`TrainingMode` and forwards the
hybrid events to it (docs/hybrid.md): a :class:`~hetero_strategy.hybrid.HybridTraining` in
``mode="hybrid"``, a :class:`SyncTraining` in ``mode="sync"``, where DDP exchanges gradients
every step and every step is a sync point. The hybrid package implements this interface without
importing the runtime.

Example::

    mode = SyncTraining()
    with mode.local_step(ddp):       # nothing: DDP's gradient exchange runs as usual
        loss.backward()
    mode.step_end(samples=32)        # True: every step ends synced
    mode.sync_points(steps=7)        # 7: checkpoints are scheduled by optimizer steps
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

__all__ = ["SyncTraining", "TrainingEvents", "TrainingMode"]


class TrainingMode(Protocol):
    """The runtime's training mode (see the module docstring)."""

    synced: bool
    """Every rank holds the same model now: where to evaluate or save."""
    per_rank_optimizers: bool
    """Each rank keeps its own optimizer state, which checkpoints carry per rank."""

    def attach(self, ddp_model: Any) -> None: ...
    def local_step(self, ddp_model: Any) -> contextlib.AbstractContextManager: ...
    def before_optimizer_step(self, optimizer: Any) -> None: ...
    def check_local_clipping(self, optimizers: Any, loss_scaled: bool) -> None: ...
    def step_end(self, samples: float) -> bool: ...
    def join(self) -> None: ...
    def evaluated(self, val_loss: float) -> bool: ...
    def sync_points(self, steps: int) -> int: ...
    def require_synced(self, what: str) -> None: ...
    def metrics(self) -> dict[str, float]: ...


class SyncTraining:
    """``mode="sync"``: plain DDP every step; each hybrid event is a no-op, every step a sync point."""

    synced = True
    per_rank_optimizers = False

    def attach(self, ddp_model: Any) -> None:
        """Nothing to set up: DDP's own gradient exchange keeps the replicas identical."""

    def local_step(self, ddp_model: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def before_optimizer_step(self, optimizer: Any) -> None:
        """No local clipping outside local phases."""

    def check_local_clipping(self, optimizers: Any, loss_scaled: bool) -> None:
        """Nothing to refuse: no local clipping (and no collective)."""

    def step_end(self, samples: float) -> bool:
        return True

    def join(self) -> None:
        """Every rank took the same steps: nobody waits."""

    def evaluated(self, val_loss: float) -> bool:
        return False  # no phase to switch

    def sync_points(self, steps: int) -> int:
        return steps

    def require_synced(self, what: str) -> None:
        """Always synced: nothing to refuse."""

    def metrics(self) -> dict[str, float]:
        return {}


class TrainingEvents:
    """The hybrid mode's events as :class:`~hetero_strategy.runtime.HeteroRuntime` methods (docs/hybrid.md):
    each forwards to the runtime's ``training`` (a :class:`TrainingMode`); no-ops in sync mode."""

    training: TrainingMode
    steps: int
    metrics_due: Any  # HeteroRuntime.metrics_due(step, every)

    def local_step(self, ddp_model: Any) -> contextlib.AbstractContextManager:
        """``with runtime.local_step(ddp): loss.backward()``: no gradient exchange in a local phase."""
        return self.training.local_step(ddp_model)

    def before_optimizer_step(self, optimizer: Any) -> None:
        """Just before ``optimizer.step()``: local gradient clipping in a local phase."""
        self.training.before_optimizer_step(optimizer)

    def join(self) -> None:
        """This rank's data is over: in a local phase, join the others' syncs until all joined (collective)."""
        self.training.join()

    def evaluated(self, val_loss: float) -> bool:
        """Every rank, at each evaluation (right after a sync): the phase schedule; True on a switch."""
        return self.training.evaluated(val_loss)

    @property
    def synced(self) -> bool:
        """Every rank holds the same model now (always, outside local phases): where to evaluate or save."""
        return self.training.synced

    def checkpoint_step(self) -> int:
        """What checkpoints are scheduled and named by, alike on every rank (hybrid: the synced points)."""
        return self.training.sync_points(self.steps)

    def metrics_point(self, step: int, every: int) -> bool:
        """Whether every rank gathers :meth:`metrics` after the framework's ``step`` (hybrid: synced points)."""
        return self.training.synced and self.metrics_due(self.training.sync_points(step), every)

    def require_synced(self, what: str) -> None:
        """Refuse a collective or a save (``what``) where the ranks' models and step counts differ."""
        self.training.require_synced(what)
