"""Each codec's per-step work as DDP runs it: the real hook on a one-rank group (``profile --model``).

``compression="auto"`` rates a codec from stand-ins (:func:`~.auto.measure`: the Top-K pass per
entry, torch's PowerSGD matmuls on random matrices). A training step pays more: DDP copies every
gradient into its buckets and back, and the hook adds its own passes (PowerSGD's error feedback,
its per-tensor copies and the rank-1 tensors it leaves dense; Top-K's residual and its marker).
On one CPU core PowerSGD's hook on ResNet-18 measured about 2x its stand-in. The planner (balance/plan.py)
needs the step's figure, so the profile times it: the model's step under DDP with the hook, minus
the same step under ``no_sync()`` (no bucket, no hook), on a group of this rank alone, so that
no link is in the figure (the cost model adds the exchange).

Example::

    hook_seconds(model, batch, loss, ["dense", "powersgd rank 4"])   # {"dense": 0.01, ...}
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["candidate_config", "hook_seconds"]


def candidate_config(label: str) -> Any:
    """The HeteroConfig whose hook runs the codec of a ``compression="auto"`` candidate label
    (``dense``, ``fp16``, ``powersgd rank 4``, ``topk_allreduce density 0.01``, ``topk density 0.05``),
    compressing from its second step whatever the link (no dense fallback)."""
    from hetero_strategy.config import HeteroConfig

    codec, _, value = label.partition(" ")
    if codec == "dense":
        return HeteroConfig.from_flat(compression="none")
    if codec in ("fp16", "bf16"):
        return HeteroConfig.from_flat(compression=codec)
    if codec == "powersgd":
        return HeteroConfig.from_flat(compression="powersgd", powersgd_rank=int(value.split()[-1]), dense_warmup_steps=1)
    if codec in ("topk", "topk_allreduce"):
        return HeteroConfig.from_flat(compression=codec, base_density=float(value.split()[-1]), min_density=None,
                                      density_schedule="constant", dense_warmup_steps=1, dense_fallback=False)
    raise ValueError(f"codec label {label!r} is invalid: use dense, fp16, bf16, 'powersgd rank R', "
                     "'topk_allreduce density D' or 'topk density D'")


def _solo_group() -> tuple[Any, bool]:
    """A gloo group of this rank alone (collective over the default group), and whether this call
    started the default group (a single process: then the caller destroys it)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60))
        return dist.group.WORLD, True
    groups = [dist.new_group([r], backend="gloo") for r in range(dist.get_world_size())]  # every rank makes each
    return groups[dist.get_rank()], False


def hook_seconds(model: torch.nn.Module, batch: Any, loss: Callable[[torch.nn.Module, Any], torch.Tensor],
                 labels: Sequence[str], pairs: int = 3) -> dict[str, float]:
    """CPU seconds per step of each codec's hook (with DDP's buckets) on ``model`` at ``batch``.

    NOTE: CPU time, not wall time: under a CPU quota a step runs in bursts of the scheduler's
    period (100 ms), which would blur a difference of two steps by up to twice that; the caller
    divides by the share of a core the rank gets (:func:`~hetero_strategy.balance.model_step.measure_model_step`).
    On a GPU the hooks' kernels are asynchronous: this counts their launches, not their run.

    Per label: a copy of the model under DDP with the label's hook, 3 warm-up steps (DDP's bucket
    rebuild, PowerSGD's dense start), then ``pairs`` of (step with the hook, step under
    ``no_sync``); the figure is the median difference, at least 0. Collective when a default
    group is up: every rank calls it with the same labels.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hetero_strategy.hooks.factory import build_comm_hook

    group, owned = _solo_group()
    out: dict[str, float] = {}
    try:
        for label in labels:
            ddp = DDP(copy.deepcopy(model), process_group=group)
            ddp.register_comm_hook(*build_comm_hook(candidate_config(label), group, max_steps=1000))
            for _ in range(3):
                _step(ddp, batch, loss, True)
            gaps = [_step(ddp, batch, loss, True) - _step(ddp, batch, loss, False) for _ in range(pairs)]
            out[label] = max(0.0, statistics.median(gaps))
    finally:
        if owned:
            dist.destroy_process_group()
    return out


def _step(ddp: Any, batch: Any, loss: Callable[[torch.nn.Module, Any], torch.Tensor], sync: bool) -> float:
    """CPU seconds (this process, every thread) of forward + backward, with DDP's exchange (``sync``)
    or under ``no_sync``."""
    c0 = time.process_time()
    with contextlib.nullcontext() if sync else ddp.no_sync():
        loss(ddp, batch).backward()
    for p in ddp.parameters():
        p.grad = None
    return time.process_time() - c0
