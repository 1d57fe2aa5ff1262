"""The sum over ranks of the period's weighted model deltas: dense, or Top-K with error feedback.

Top-K (``delta_density``) sends each rank's k = ceil(density x numel) largest entries of
``acc = w_r delta_r + residual`` and keeps the rest as the residual, added to the next period's
delta: what a rank does not send now it sends later, so no local progress is dropped, only late.
It is the DDP hooks' exchange (:func:`~hetero_strategy.hooks.topk_ef.topk_ef_exchange`, one bucket
of one segment), non-finite marker included: a NaN/inf accumulator on any rank comes back all-NaN
on every rank and its rank's residual keeps its last finite value. When the payload would
outweigh a dense all-reduce (density x world size >= 1; with ``delta_codec="topk_allreduce"``,
1.5 x density >= 1) the exchange is dense and the residual is flushed into it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.cluster.wire import wire_entries
from hetero_strategy.hooks.topk_ef import TopKPlan, TopKState, topk_ef_exchange

__all__ = ["DeltaExchange"]

_BUCKET, _KEYS = 0, (0,)  # the delta is one bucket of one segment: its residual's keys


class DeltaExchange:
    """Sums one flat fp32 tensor over the ranks; keeps this rank's error-feedback residual.

    Args:
        density: fraction of entries each rank sends; None: dense fp32 all-reduce, no residual.
        world_size: ranks in ``group``.
        group: the process group (default: the default group).
        shared_indices: send at one index set every rank shares, summed by one all-reduce
            (``delta_codec="topk_allreduce"``), instead of all-gathering each rank's own top-k.

    Example::

        exchange = DeltaExchange(0.01, world_size)
        total = exchange.reduce(weight * delta)   # (numel,) fp32: every rank's sent part, summed
    """

    __slots__ = ("bytes_sent", "density", "topk", "world_size")

    def __init__(self, density: float | None, world_size: int, group: dist.ProcessGroup | None = None,
                 shared_indices: bool = False) -> None:
        self.density, self.world_size = density, world_size
        self.topk = TopKState(group, shared_indices=shared_indices)  # the residual: weighted delta not sent yet
        self.bytes_sent = 0  # values and indices (or the dense delta) of the last exchange, for metrics

    @property
    def group(self) -> dist.ProcessGroup | None:
        return self.topk.process_group

    def sparse(self) -> bool:
        if self.density is None:
            return False
        return wire_entries(self.density, self.world_size, self.topk.agreement is not None) < 1

    def flush(self, numel: int, device: torch.device) -> torch.Tensor:
        """Every rank's residual, summed densely (collective); the residuals start again from zero."""
        return self.reduce(torch.zeros(numel, device=device), dense=True)

    def reduce(self, flat: torch.Tensor, dense: bool = False) -> torch.Tensor:
        """Sum of every rank's ``flat`` (numel,) fp32 as sent (collective; ``flat`` is used up)."""
        n = flat.numel()
        if self.density is None:  # no error feedback: the plain all-reduce, in place
            self.bytes_sent = 4 * n
            if self.world_size > 1:
                dist.all_reduce(flat, group=self.group)
            return flat
        if dense or not self.sparse():
            plan, self.bytes_sent = TopKPlan.dense([n]), 4 * n
        else:
            k = max(1, math.ceil(self.density * n))
            # NOTE: the 4-byte non-finite marker riding along is left out of the metric; shared
            # indices: k values in the all-reduce and k indices broadcast
            plan, self.bytes_sent = TopKPlan([True], [k], [k], [False]), 4 * 2 * k
        return topk_ef_exchange(self.topk, _BUCKET, _KEYS, flat, [n], plan).wait()

    def state_dict(self) -> dict[str, Any]:
        out = {"residual": self.topk.memory.state_dict()["residuals"].get(_KEYS[0])}
        if self.topk.agreement is not None:
            out["shared_indices"] = self.topk.agreement.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        residual = state.get("residual")
        self.topk.memory.load_state_dict({"residuals": {} if residual is None else {_KEYS[0]: residual}})
        if self.topk.agreement is not None:
            self.topk.agreement.load_state_dict(state.get("shared_indices", {}))
