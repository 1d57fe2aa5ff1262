"""Choose the comm hook and its state from the configuration."""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist

from hetero_strategy.config import HeteroConfig
from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

__all__ = ["build_comm_hook"]


def build_comm_hook(
    config: HeteroConfig, process_group: dist.ProcessGroup | None = None, trainer: Any = None
) -> tuple[WeightedReduceState, Callable]:
    """(state, hook) for ``ddp.register_comm_hook``; ``trainer`` (optional) gives max_steps for schedules."""
    method = config.compression.method
    if method == "none":
        return WeightedReduceState(process_group), weighted_allreduce_hook
    raise NotImplementedError(f"compression={method!r} is not available yet")
