"""Split a global batch into per-rank batch sizes proportional to capacities.

The split is deterministic (same inputs give the same sizes on every rank), sums exactly to the
global batch, gives each rank at least ``min_per_rank`` samples and at most its memory cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["capacity", "least_share", "split_batch", "split_batch_timed"]


def least_share(global_batch: int, world: int) -> int:
    """The fewest samples a *measured* split gives a rank: 2 where the global batch allows.

    NOTE: a BatchNorm layer cannot train on one sample where its input is 1x1 (a ResNet's last stage
    on small images: it raises), and a noisy probe of a slow rank asked for exactly that once
    (bench plan, 1.0 / 0.57 of a core: [63, 1]). A share the user gave is kept as given."""
    return 2 if global_batch >= 2 * world else 1


def capacity(
    compute: Sequence[float], bandwidth: Sequence[float] | None = None, alpha: float = 0.7, beta: float = 0.3
) -> list[float]:
    """capacity_r = alpha * compute_r / sum(compute) + beta * bandwidth_r / sum(bandwidth).

    Without bandwidth figures (None) only compute counts: a uniform bandwidth term would pull the
    shares toward equal ones although nothing was measured that says so.
    """
    total_c = float(sum(compute))
    if total_c <= 0 or any(c <= 0 for c in compute):
        raise ValueError(f"compute={list(compute)!r} is invalid: every rank needs a positive measured speed")
    c = [x / total_c for x in compute]
    if bandwidth is None or beta == 0:
        return c
    if len(bandwidth) != len(compute) or any(b <= 0 for b in bandwidth):
        raise ValueError(f"bandwidth={list(bandwidth)!r} is invalid: give one positive figure per rank")
    total_b = float(sum(bandwidth))
    return [(alpha * ci + beta * bi / total_b) / (alpha + beta) for ci, bi in zip(c, bandwidth)]


def split_batch(
    global_batch: int,
    capacities: Sequence[float],
    max_per_rank: Sequence[int] | None = None,
    min_per_rank: int = 1,
) -> list[int]:
    """Per-rank sizes b_r with sum(b) == global_batch, b_r proportional to capacities.

    1. Continuous targets by water-filling: shares proportional to capacity, clamped into
       [min_per_rank, max_per_rank[r]], the clamped excess redistributed among the others.
    2. Largest-remainder rounding of the targets (ties to the lower rank), so the sum is exact.

    Example::

        >>> split_batch(16, [1.0, 0.57])
        [10, 6]
    """
    n = len(capacities)
    if n == 0:
        raise ValueError("capacities=[] is invalid: give one capacity per rank")
    lo, hi = _rank_bounds(global_batch, n, max_per_rank, min_per_rank)
    target = _water_fill(float(global_batch), [float(c) for c in capacities], lo, hi)
    return _round_targets(global_batch, target, lo, hi)


def split_batch_timed(
    global_batch: int,
    samples_per_s: Sequence[float],
    fixed_s: Sequence[float],
    max_per_rank: Sequence[int] | None = None,
    min_per_rank: int = 1,
) -> list[int]:
    """Per-rank sizes that make every rank's step ``fixed_s[r] + b_r / samples_per_s[r]`` equally long.

    The continuous solution b_r = samples_per_s[r] * (T - fixed_s[r]), clamped to the caps, with
    T found by bisection so the sizes sum to the global batch; then the same exact rounding as
    :func:`split_batch`. With all fixed costs 0 this is :func:`split_batch` on the rates.

    Example::

        >>> split_batch_timed(256, [540.0, 336.0], [0.0, 0.05])
        [168, 88]
    """
    n = len(samples_per_s)
    if n == 0 or len(fixed_s) != n:
        raise ValueError(f"samples_per_s={list(samples_per_s)!r}, fixed_s={list(fixed_s)!r} are invalid: "
                         "give one rate and one fixed cost per rank")
    if any(r <= 0 for r in samples_per_s) or any(f < 0 for f in fixed_s):
        raise ValueError(f"samples_per_s={list(samples_per_s)!r}, fixed_s={list(fixed_s)!r} are invalid: rates "
                         "must be positive and fixed costs non-negative")
    lo, hi = _rank_bounds(global_batch, n, max_per_rank, min_per_rank)

    def sizes_at(t: float) -> list[float]:
        return [min(hi[r], max(lo[r], samples_per_s[r] * (t - fixed_s[r]))) for r in range(n)]

    low, high = 0.0, max(fixed_s) + global_batch / min(samples_per_s)  # sum(sizes_at(high)) >= G
    for _ in range(100):  # halves the bracket each time: far below float resolution at the end
        mid = (low + high) / 2
        low, high = (mid, high) if sum(sizes_at(mid)) < global_batch else (low, mid)
    return _round_targets(global_batch, sizes_at(high), lo, hi)


def _rank_bounds(global_batch: int, n: int, max_per_rank: Sequence[int] | None, min_per_rank: int
                 ) -> tuple[list[int], list[int]]:
    """Per-rank [lo, hi] sample bounds; refuses caps or floors that cannot add up to the global batch."""
    hi = [global_batch] * n if max_per_rank is None else [int(m) for m in max_per_rank]
    lo = [min(min_per_rank, h) for h in hi]
    if sum(lo) > global_batch:
        raise ValueError(f"global batch {global_batch} is smaller than {sum(lo)}: every rank needs "
                         f"at least {min_per_rank} sample(s); raise the batch size")
    if sum(hi) < global_batch:
        raise ValueError(f"max_batch_sizes={list(hi)!r} allow only {sum(hi)} samples but the global batch "
                         f"is {global_batch}; raise the caps or lower the batch size")
    return lo, hi


def _round_targets(global_batch: int, target: list[float], lo: list[int], hi: list[int]) -> list[int]:
    """Largest-remainder rounding of continuous targets (ties to the lower rank); the sum is exact."""
    n = len(target)
    sizes = [max(lo[r], min(hi[r], math.floor(target[r] + 1e-9))) for r in range(n)]
    order = sorted(range(n), key=lambda r: (-(target[r] - sizes[r]), r))
    i = 0
    while sum(sizes) < global_batch:  # at most n rounds of +1 (bounded by the caps check above)
        r = order[i % n]
        if sizes[r] < hi[r]:
            sizes[r] += 1
        i += 1
    while sum(sizes) > global_batch:  # only when the floor of min_per_rank overshot
        r = max(range(n), key=lambda r: (sizes[r] - target[r], -r))
        sizes[r] -= 1
    return sizes


def _water_fill(total: float, caps: list[float], lo: list[int], hi: list[int]) -> list[float]:
    n = len(caps)
    fixed: dict[int, float] = {}
    for _ in range(n + 1):  # each round fixes at least one rank or ends
        free = [r for r in range(n) if r not in fixed]
        remaining = total - sum(fixed.values())
        weight = sum(caps[r] for r in free)
        share = {r: remaining * caps[r] / weight for r in free}
        over = [r for r in free if share[r] > hi[r]]
        under = [r for r in free if share[r] < lo[r]]
        if not over and not under:
            return [fixed.get(r, share.get(r, 0.0)) for r in range(n)]
        for r in over:
            fixed[r] = float(hi[r])
        if not over:
            for r in under:
                fixed[r] = float(lo[r])
    return [fixed.get(r, float(lo[r])) for r in range(n)]
