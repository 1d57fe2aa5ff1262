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

__all__ = ["SyncTraining", "TrainingMode"]


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
