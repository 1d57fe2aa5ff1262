"""Collectives (GRACE's "Communicator" role) with exact per-rank byte accounting.

Every function *issues* its collective immediately (never from a future callback): on gloo all
ranks must issue collectives in the same order, and DDP calls the hook for buckets in index order
on every rank, so issuing from the hook call keeps the order uniform.

Bytes are counted as the standard ring algorithms move them, per rank:
all-reduce of B bytes sends and receives 2(W-1)/W * B; all-gather of P bytes per rank sends and
receives (W-1) * P.

Example::

    fut, nbytes = all_reduce(tensor, group=None)       # fut.value()[0] is the summed tensor
    fut, out, nbytes = all_gather(payload, group=None) # out: (W, payload numel)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_reduce", "completed", "then", "world_size"]

# NOTE: torch 2.14 renamed all_gather_into_tensor (now deprecated) to all_gather_single
_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def then(fut: torch.futures.Future, result: Callable[[], Any]) -> torch.futures.Future:
    """``fut.then`` for a callback that reads its collective's tensors, not the future's value.

    NOTE: the future's error is raised first: a gloo collective that failed (a dead peer) leaves
    its output tensors half-written, and decoding them would hand DDP garbage instead of the
    error (NCCL reports failures through its watchdog instead).
    """
    def run(f: torch.futures.Future) -> Any:
        value = f.value()  # raises the error of a failed collective
        if isinstance(value, list):  # collect_all's futures: each one's error too
            for part in value:
                if isinstance(part, torch.futures.Future):
                    # NOTE: wait(), not value(): collect_all's future has no devices, so its
                    # callback is not ordered after NCCL's stream; a part's wait() makes the
                    # current stream wait for that collective's events (no host sync)
                    part.wait()
        return result()

    return fut.then(run)


def world_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> tuple[torch.futures.Future, int]:
    """Sum ``tensor`` in place across ranks; (future, bytes sent = bytes received by this rank)."""
    if not dist.is_initialized():  # a world of 1 still runs the collective: the same code path
        return completed(tensor), 0
    w = world_size(group)
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    nbytes = 2 * (w - 1) * tensor.numel() * tensor.element_size() // w
    return fut, nbytes


def all_gather(payload: torch.Tensor, group: dist.ProcessGroup | None) -> tuple[torch.futures.Future, torch.Tensor, int]:
    """Gather equal-size 1-D payloads into (W, numel); (future, output, bytes sent by this rank)."""
    if not dist.is_initialized():
        return completed(payload), payload.unsqueeze(0), 0
    w = world_size(group)
    flat = torch.empty(w * payload.numel(), dtype=payload.dtype, device=payload.device)  # gloo wants 1-D
    fut = _gather_single(flat, payload, group=group, async_op=True).get_future()
    return fut, flat.view(w, payload.numel()), (w - 1) * payload.numel() * payload.element_size()


def completed(value: torch.Tensor) -> torch.futures.Future:
    """A future already holding ``value`` (for steps with nothing to exchange)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return fut
