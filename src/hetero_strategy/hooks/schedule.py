"""Density schedule of the sparse exchange (docs/design.md semantics 7).

A warm-up, then a cosine decay from ``base_density x tier_factor`` to ``min_density`` over
``period`` steps; after the period the density stays at its floor. The warm-up is dense for
``warmup_steps`` steps, or (``exponential``, DGC's warm-up) dense at step 0 only and then falling
geometrically to the schedule's first density d_W: d_t = d_W ** (t / W) for 0 < t < W. Every
rank computes every rank's schedule from the step number alone, so payload sizes agree without
communication.

Example::

    s = DensitySchedule(base_density=0.01, min_density=0.001, warmup_steps=10, period=1000)
    s.density(step=5, tier_factor=0.5)     # 1.0 (warm-up: dense)
    s.density(step=10, tier_factor=0.5)    # 0.005
    s.k(numel=1_000_000, step=10, tier_factor=0.5)   # 5000 entries
    DensitySchedule(0.01, 0.001, 4, exponential=True).density(2, 1.0)   # 0.01 ** (2/4) = 0.1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetero_strategy.cluster.wire import topk_k

__all__ = ["DensitySchedule"]


@dataclass(frozen=True)
class DensitySchedule:
    base_density: float
    min_density: float
    warmup_steps: int = 1
    period: int = 1000
    cosine: bool = True
    """False keeps base_density x tier_factor constant after the warm-up."""
    exponential: bool = False
    """Warm-up shape: False sends everything for ``warmup_steps`` steps; True only at step 0
    (DDP rebuilds its buckets after step 1), then ramps down geometrically (module docstring)."""

    def in_warmup(self, step: int) -> bool:
        """A fully dense warm-up step (the hooks' plain all-reduce, no residuals)."""
        return step < (1 if self.exponential else self.warmup_steps)

    def density(self, step: int, tier_factor: float | None) -> float:
        """Fraction of entries sent at ``step`` by a rank of the given tier (None = dense tier)."""
        if tier_factor is None or self.in_warmup(step):
            return 1.0
        if step < self.warmup_steps:  # exponential ramp: 1 at step 0, d_W at step W, geometric between
            return self.density(self.warmup_steps, tier_factor) ** (step / self.warmup_steps)
        t = min(step - self.warmup_steps, self.period)  # hold the floor once the period is over
        decay = (1.0 + math.cos(math.pi * t / self.period)) / 2.0 if self.cosine else 1.0
        return min(1.0, max(self.min_density, self.base_density * tier_factor * decay))

    def k(self, numel: int, step: int, tier_factor: float | None) -> int:
        """Entries sent from a bucket of ``numel`` entries (at least 1 for a non-empty bucket)."""
        return self.k_for(numel, self.density(step, tier_factor))

    @staticmethod
    def k_for(numel: int, density: float) -> int:
        """ceil(density x numel), at least 1 for a non-empty tensor (:func:`~hetero_strategy.cluster.wire.topk_k`)."""
        return topk_k(numel, density)
