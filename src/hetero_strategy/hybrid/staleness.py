"""Staleness weights of one hybrid sync: how much each rank's model delta counts in the average.

A rank's delta weighs its samples of the period times ``decay`` to the power of its staleness
(how many local steps it is behind the period's leader), normalised to sum 1: a late rank's work
is in the average with a smaller weight, never dropped (docs/hybrid.md, "One period").
"""

from __future__ import annotations

__all__ = ["staleness_weights"]


def staleness_weights(steps: list[int], samples: list[float], decay: float) -> list[float]:
    """``samples_r · decay^(max(steps) - steps_r)``, normalised to sum 1 (all 0 when no samples).

    Example::

        staleness_weights([4, 2], [32.0, 16.0], 0.5)   # [32 : 16 * 0.25] -> [0.888..., 0.111...]
    """
    lead = max(steps)
    raw = [n * decay ** (lead - s) for s, n in zip(steps, samples, strict=True)]
    total = sum(raw)
    return [w / total if total > 0 else 0.0 for w in raw]
