"""The sum over ranks of the period's weighted model deltas: dense, or Top-K with error feedback.

Top-K (``delta_density``) sends each rank's k = ceil(density x numel) largest entries of
``acc = w_r delta_r + residual`` and keeps the rest as the residual, added to the next period's
delta: what a rank does not send now it sends later, so no local progress is dropped, only late
(error feedback, as the gradient hooks do; docs/compression.md). Values and indices travel in one
all-gather (the hooks' :class:`~hetero_strategy.hooks.codecs.TopKCodec` payload). When that
payload would outweigh a dense all-reduce (density x world size >= 1) the exchange is dense and
the residual is flushed into it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.hooks.codecs import TopKCodec, ef_accumulate_

__all__ = ["DeltaExchange"]


class DeltaExchange:
    """Sums one flat fp32 tensor over the ranks; keeps this rank's error-feedback residual.

    Args:
        density: fraction of entries each rank sends; None: dense fp32 all-reduce.
        world_size: ranks in ``group``.
        group: the process group (default: the default group).

    Example::

        exchange = DeltaExchange(0.01, world_size)
        total = exchange.reduce(weight * delta)   # (numel,) fp32: every rank's sent part, summed
    """

    __slots__ = ("bytes_sent", "density", "group", "residual", "world_size")

    def __init__(self, density: float | None, world_size: int, group: dist.ProcessGroup | None = None) -> None:
        self.density, self.world_size, self.group = density, world_size, group
        self.residual: torch.Tensor | None = None  # (numel,) fp32: weighted delta not sent yet
        self.bytes_sent = 0  # of the last exchange, for metrics

    def sparse(self) -> bool:
        return self.density is not None and self.density * self.world_size < 1

    def flush(self, numel: int, device: torch.device) -> torch.Tensor:
        """This rank's residual (zeros without one), handed over for a dense :meth:`reduce`."""
        residual = torch.zeros(numel, device=device) if self.residual is None else self.residual
        self.residual = None
        return residual

    def reduce(self, flat: torch.Tensor, dense: bool = False) -> torch.Tensor:
        """Sum of every rank's ``flat`` (numel,) fp32 as sent: in place when dense."""
        if self.residual is not None:
            flat = ef_accumulate_(flat, self.residual, 1.0)  # acc = flat + residual
            self.residual = None
        if dense or not self.sparse():
            self.bytes_sent = 4 * flat.numel()
            if self.world_size > 1:
                dist.all_reduce(flat, group=self.group)
            return flat
        k = max(1, math.ceil(self.density * flat.numel()))
        payload, self.residual = TopKCodec.compress(flat, k, k)  # (2k,) fp32, (numel,) fp32
        self.bytes_sent = 4 * payload.numel()
        gathered = payload.view(1, -1)
        if self.world_size > 1:
            every = [torch.empty_like(payload) for _ in range(self.world_size)]
            dist.all_gather(every, payload, group=self.group)
            gathered = torch.stack(every)  # (R, 2k)
        return TopKCodec.decompress(gathered, flat.numel())

    def state_dict(self) -> dict[str, Any]:
        return {"residual": None if self.residual is None else self.residual.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        residual = state.get("residual")
        self.residual = None if residual is None else residual.clone()
