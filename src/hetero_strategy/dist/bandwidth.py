"""How long a dense all-reduce takes over a group: the one link probe of tiers, cost and profiler."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hetero_strategy.dist.placement import device_for

__all__ = ["allreduce_seconds", "measure_bandwidth_gbps"]

# 256 KiB, 4 MiB, 32 MiB of fp32: grown until one all-reduce is long enough to measure
_PROBE_NUMELS = (1 << 16, 1 << 20, 1 << 23)


def allreduce_seconds(numel: int, process_group: dist.ProcessGroup | None = None, iters: int = 1,
                      dtype: torch.dtype = torch.float32) -> float:
    """Seconds per sum all-reduce of ``numel`` elements (fp32 unless ``dtype``): the slowest rank's mean over ``iters``
    calls after one untimed warm-up (connection set-up, allocation). Collective; every rank gets
    the same number, so loops sized from it run the same count everywhere.

    Example::

        dt = allreduce_seconds(1 << 20)         # 4 MiB; algbw = 4 MiB * 8 / dt
    """
    device = device_for(process_group)
    payload = torch.ones(max(1, numel), dtype=dtype, device=device)
    dist.all_reduce(payload, group=process_group)
    dist.barrier(group=process_group)  # every rank starts the clock together
    t0 = time.perf_counter()
    for _ in range(max(1, iters)):
        dist.all_reduce(payload, group=process_group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # NOTE: a setup-time probe: the time must cover the transfer
    took = torch.tensor([(time.perf_counter() - t0) / max(1, iters)], dtype=torch.float64, device=device)
    dist.all_reduce(took, group=process_group, op=dist.ReduceOp.MAX)
    return float(took.item())


def measure_bandwidth_gbps(process_group: dist.ProcessGroup | None = None, min_seconds: float = 0.05) -> float:
    """Algorithmic bandwidth of a dense all-reduce (payload bits / time), in Gbit/s.

    Collective. The payload grows (256 KiB -> 32 MiB) until one all-reduce takes at least
    ``min_seconds``, so a fast link is not measured by its latency and a slow one is not kept busy
    for long.
    """
    elapsed, nbytes = 0.0, 0
    for numel in _PROBE_NUMELS:
        elapsed, nbytes = allreduce_seconds(numel, process_group), numel * 4
        if elapsed >= min_seconds:
            break
    return nbytes * 8 / max(elapsed, 1e-9) / 1e9
