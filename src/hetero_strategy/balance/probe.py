"""Measure this rank's training speed on the real model, and share the figures with all ranks."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["all_gather_floats", "measure_samples_per_s"]


def measure_samples_per_s(step_fn: Callable[[], None], samples: int, steps: int = 3, warmup: int = 1) -> float:
    """Samples/s of ``step_fn`` (one forward+backward over ``samples`` samples), median of ``steps``.

    No collective runs inside, so the figure is pure compute: nothing waits for a peer.
    """
    for _ in range(warmup):
        step_fn()
    times = []
    for _ in range(steps):
        _sync()
        t0 = time.perf_counter()
        step_fn()
        _sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return samples / max(times[len(times) // 2], 1e-9)


def all_gather_floats(values: list[float], group: dist.ProcessGroup | None = None) -> list[list[float]]:
    """All-gather a short list of floats from every rank (float64, so every rank sees the same bits)."""
    if not dist.is_initialized():
        return [list(values)]
    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    mine = torch.tensor(values, dtype=torch.float64, device=device)  # (k,)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return [t.cpu().tolist() for t in out]


def _sync() -> None:
    # NOTE: a device-wide synchronize is fine here: the probe runs once at setup, not in a hook.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
