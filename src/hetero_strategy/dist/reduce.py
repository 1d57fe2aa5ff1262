"""One collective over many tensors of different shapes, dtypes and devices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.dist.placement import device_for

__all__ = ["reduce_flat"]


def reduce_flat(tensors: list[torch.Tensor], op: Any, group: dist.ProcessGroup | None, scale: float = 1.0) -> None:
    """Reduce ``tensors`` in place with one all-reduce of their float64 concatenation, each first
    multiplied by ``scale`` (collective: the same list, in the same order, on every rank).

    Example::

        reduce_flat(moments, dist.ReduceOp.SUM, group, scale=my_share)   # a weighted mean
    """
    if not tensors:
        return
    # NOTE: on the group's device: NCCL takes CUDA tensors only, and Adam keeps its `step` on the CPU
    device = device_for(group)
    flat = torch.cat([t.detach().to(device, torch.float64).reshape(-1) for t in tensors]).mul_(scale)  # (total,)
    dist.all_reduce(flat, op=op, group=group)
    for t, part in zip(tensors, _split(flat, tensors), strict=True):
        t.copy_(part.view_as(t))  # copy_ converts dtype and device back


def _split(flat: torch.Tensor, like: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    offset = 0
    for t in like:
        yield flat[offset:offset + t.numel()]
        offset += t.numel()
