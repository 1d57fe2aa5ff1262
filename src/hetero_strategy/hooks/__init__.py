"""DDP comm hooks in PyTorch's shape ``hook(state, bucket) -> Future[Tensor]``."""

from hetero_strategy.hooks.factory import build_comm_hook
from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

__all__ = ["WeightedReduceState", "build_comm_hook", "weighted_allreduce_hook"]
