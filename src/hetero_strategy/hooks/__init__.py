"""DDP comm hooks in PyTorch's shape ``hook(state, bucket) -> Future[Tensor]``.

Dense sample-weighted reduction (:func:`weighted_allreduce_hook`) and the compressed variants
(:func:`topk_hook` for topk/tiered, :func:`onebit_hook`, :func:`cast_hook`, PowerSGD baseline);
:func:`build_comm_hook` picks one from a :class:`HeteroConfig`. The Top-K exchange with error
feedback beneath them (:func:`topk_ef_exchange`, :class:`TopKState`) also sums the hybrid mode's
model deltas. See docs/compression.md.
"""

from hetero_strategy.hooks.baselines import (
    CastState,
    PowerSGDBaselineState,
    cast_hook,
    powersgd_weighted_hook,
)
from hetero_strategy.hooks.compressed import CompressedState
from hetero_strategy.hooks.compressed_hooks import onebit_hook, topk_hook
from hetero_strategy.hooks.factory import build_comm_hook
from hetero_strategy.hooks.topk_ef import TopKPlan, TopKState, topk_ef_exchange
from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

__all__ = [
    "CastState",
    "CompressedState",
    "PowerSGDBaselineState",
    "TopKPlan",
    "TopKState",
    "WeightedReduceState",
    "build_comm_hook",
    "cast_hook",
    "onebit_hook",
    "powersgd_weighted_hook",
    "topk_ef_exchange",
    "topk_hook",
    "weighted_allreduce_hook",
]
