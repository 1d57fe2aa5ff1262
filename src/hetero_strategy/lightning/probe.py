"""Time a LightningModule's own training_step + backward on this rank, leaving no trace."""

from __future__ import annotations

from typing import Any

from hetero_strategy.balance.probe import ProbeExchange, StepCost, probe_step_cost

__all__ = ["probe_lightning_module"]


def probe_lightning_module(module: Any, batches: list[tuple[Any, int]], steps: int,
                           exchange: ProbeExchange | bool = True) -> StepCost | None:
    """:func:`probe_step_cost` of ``module.training_step``; None under manual optimization.

    ``self.log`` calls inside training_step are ignored while probing (the rest of the probe's
    bookkeeping, RNG, buffers and gradients, is restored by :func:`probe_step_cost`).
    """
    if not module.automatic_optimization:
        return None  # training_step would step optimizers itself

    def loss_fn(batch: Any) -> Any:
        out = module.training_step(batch, 0)
        return out["loss"] if isinstance(out, dict) else out

    module.log = lambda *a, **k: None
    module.log_dict = lambda *a, **k: None
    try:
        return probe_step_cost(module, loss_fn, batches, steps, exchange=exchange)
    finally:
        del module.log, module.log_dict  # drop the instance attributes; the class methods return
