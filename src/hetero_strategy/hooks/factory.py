"""Choose the comm hook and its state from the configuration.

Example::

    state, hook = build_comm_hook(HeteroConfig.from_flat(compression="topk"))
    ddp_model.register_comm_hook(state, hook)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import COMPRESSION_METHODS, CompressionConfig, HeteroConfig
from hetero_strategy.hooks.baselines import (
    CastState,
    PowerSGDBaselineState,
    cast_hook,
    powersgd_weighted_hook,
)
from hetero_strategy.hooks.compressed import CompressedState, onebit_hook, topk_hook
from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

__all__ = ["build_comm_hook"]

_Builder = Callable[[CompressionConfig, Any, Any], tuple[WeightedReduceState, Callable]]


def _max_steps(trainer: Any) -> int | Callable[[], Any] | None:
    """trainer.max_steps when set; else Lightning's estimate, read lazily (it needs the data)."""
    steps = getattr(trainer, "max_steps", None)
    if isinstance(steps, int) and steps > 0:
        return steps
    if trainer is not None and hasattr(trainer, "estimated_stepping_batches"):
        return lambda: trainer.estimated_stepping_batches
    return None


_BUILDERS: dict[str, _Builder] = {
    "none": lambda cfg, pg, trainer: (WeightedReduceState(pg, overlap=cfg.overlap_comm), weighted_allreduce_hook),
    "topk": lambda cfg, pg, trainer: (CompressedState(cfg, pg, max_steps=_max_steps(trainer)), topk_hook),
    "tiered": lambda cfg, pg, trainer: (CompressedState(cfg, pg, max_steps=_max_steps(trainer)), topk_hook),
    "onebit": lambda cfg, pg, trainer: (CompressedState(cfg, pg, max_steps=_max_steps(trainer)), onebit_hook),
    "fp16": lambda cfg, pg, trainer: (CastState(pg, dtype=torch.float16), cast_hook),
    "bf16": lambda cfg, pg, trainer: (CastState(pg, dtype=torch.bfloat16), cast_hook),
    # PowerSGD needs >= 2 dense iterations (DDP's bucket rebuild), as upstream enforces
    "powersgd": lambda cfg, pg, trainer: (
        PowerSGDBaselineState(pg, rank=cfg.powersgd_rank, start_iter=max(2, cfg.dense_warmup_steps)),
        powersgd_weighted_hook,
    ),
}
assert set(_BUILDERS) == set(COMPRESSION_METHODS), "every configured method needs a builder"


def build_comm_hook(
    config: HeteroConfig, process_group: dist.ProcessGroup | None = None, trainer: Any = None
) -> tuple[WeightedReduceState, Callable]:
    """(state, hook) for ``ddp.register_comm_hook``; ``trainer`` (optional) gives max_steps for schedules.

    Collective for ``tiered`` (the ranks exchange their tiers): call it on every rank.
    """
    cfg = config.compression
    return _BUILDERS[cfg.method](cfg, process_group, trainer)
