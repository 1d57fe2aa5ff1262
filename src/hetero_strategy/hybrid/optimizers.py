"""One optimizer state on every rank when the hybrid mode enters its synchronous phase.

In local phases each rank keeps its own optimizer state (momentum, Adam moments): averaging it
would cost another model-sized exchange per period, and since the update is linear in it, momentum
SGD with H = 1 still equals synchronous SGD. DDP's replicas must be identical from the switch on,
so there the floating state is averaged once, each rank weighted by its share of the phase's
samples, and ``step`` counters take the maximum.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.dist import reduce_flat

__all__ = ["align_optimizers"]


@torch.no_grad()
def align_optimizers(optimizers: list[Any], weight: float, group: dist.ProcessGroup | None = None) -> None:
    """Every rank's floating optimizer state := sum over ranks of ``weight_r`` x its own (weights
    summing to 1), and ``step`` counters := their max (collective: same optimizers, same order).

    Example::

        align_optimizers([opt], weight=my_samples / all_samples)   # on every rank
    """
    states = [s for opt in optimizers for s in opt.state.values()]
    means = [v for s in states for k, v in s.items() if torch.is_tensor(v) and v.is_floating_point() and k != "step"]
    steps = [v for s in states for k, v in s.items() if torch.is_tensor(v) and k == "step"]
    reduce_flat(means, dist.ReduceOp.SUM, group, scale=weight)
    reduce_flat(steps, dist.ReduceOp.MAX, group)
