"""Small all-gathers of host numbers (timings, sample counts, found-inf flags)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetero_strategy.dist.placement import device_for

__all__ = ["all_gather_floats"]


def all_gather_floats(values: list[float], group: dist.ProcessGroup | None = None) -> list[list[float]]:
    """Every rank's ``values``, one row per rank (float64, so every rank sees the same bits).

    Without an initialised process group it returns this process's row alone, so single-process
    code paths need no branch.

    Example::

        rows = all_gather_floats([compute_s, batch])   # rows[r] == [compute_s_r, batch_r]
    """
    if not dist.is_initialized():
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64, device=device_for(group))  # (k,)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return [t.cpu().tolist() for t in out]
