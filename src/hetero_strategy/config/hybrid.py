"""The hybrid section: local-SGD phases that end on a validation-loss plateau (issue 14)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetero_strategy.config.errors import _fail, _number, _plain, _whole

__all__ = ["HYBRID_MODES", "HybridConfig"]

HYBRID_MODES = ("sync", "hybrid")


@dataclass(kw_only=True, slots=True)
class HybridConfig:
    """Synchronous DDP (``sync``) or local-SGD phases followed by synchronous training (``hybrid``).

    In ``hybrid`` mode training starts in phase 0 with sync period ``periods[0]``: each rank takes
    local optimizer steps without exchanging gradients, as many as its speed allows, and the ranks
    average their model deltas once per period. A plateau of the validation loss moves every rank
    to the next phase at the same evaluation; the last phase (period 1) is plain synchronous DDP.
    """

    mode: str = "sync"
    """``sync``: every step all-reduces gradients (plain DDP). ``hybrid``: local-SGD phases first."""
    periods: list[int] = field(default_factory=lambda: [8, 2, 1])
    """Sync period H of each phase, in local steps of the fastest rank; the last one must be 1 (the
    synchronous phase). Every earlier phase averages models, even with H = 1."""
    plateau_thresholds: list[float] = field(default_factory=lambda: [0.05, 0.01])
    """Leave phase i when the validation loss's relative change over the last ``plateau_evals``
    evaluations falls below ``plateau_thresholds[i]``: one per phase but the last, decreasing."""
    plateau_evals: int = 3
    """N: the relative change compares the newest validation loss with the one N evaluations
    earlier, so a phase lasts at least N + 1 evaluations."""
    max_staleness: int = 3
    """tau: a rank this many local steps behind the leader forces the period's sync, so no rank is
    ever more than tau steps behind at a sync."""
    staleness_decay: float = 0.9
    """A rank's contribution weighs samples x decay^staleness (staleness: steps behind the leader)."""
    local_clip_norm: float | None = 5.0
    """Gradient-norm clipping of every local step (local phases only); None: no clipping."""
    delta_density: float | None = None
    """Fraction of the model delta each rank sends at a sync (Top-K with error feedback: the rest
    is sent at later syncs); None sends it whole in fp32. Dense whenever density x world size >= 1."""
    delta_codec: str = "topk"
    """How a sparse delta is exchanged: topk (each rank's own top entries, all-gathered) or
    topk_allreduce (one index set every rank shares, one all-reduce; bytes do not grow with the
    world size, and it stays sparse up to density 2/3 whatever the world size)."""

    def __post_init__(self) -> None:
        if self.mode not in HYBRID_MODES:
            _fail("mode", self.mode, f"choose one of {', '.join(HYBRID_MODES)}")
        _check_periods(self.periods)
        _check_thresholds(self.plateau_thresholds, len(self.periods))
        for name in ("plateau_evals", "max_staleness"):
            value = getattr(self, name)
            if not _whole(value) or value < 1:
                _fail(name, value, "give a whole number >= 1 (defaults: plateau_evals=3, max_staleness=3)")
        if not _number(self.staleness_decay) or not 0 < self.staleness_decay <= 1:
            _fail("staleness_decay", self.staleness_decay, "give a factor in (0, 1] (default 0.9; 1 ignores staleness)")
        if self.local_clip_norm is not None and (not _number(self.local_clip_norm)
                                                 or not math.isfinite(self.local_clip_norm)
                                                 or self.local_clip_norm <= 0):
            _fail("local_clip_norm", self.local_clip_norm, "give a norm > 0 (default 5.0), or None for no clipping")
        if self.delta_density is not None and (not _number(self.delta_density) or not 0 < self.delta_density <= 1):
            _fail("delta_density", self.delta_density, "give a fraction in (0, 1] (e.g. 0.01), or None for dense deltas")
        if self.delta_codec not in ("topk", "topk_allreduce"):
            _fail("delta_codec", self.delta_codec, "choose topk or topk_allreduce")
        _plain(self)


def _check_periods(periods: Any) -> None:
    if not isinstance(periods, (list, tuple)) or not periods:
        _fail("periods", periods, "give a non-empty list of sync periods ending with 1, e.g. [8, 2, 1]")
    for i, h in enumerate(periods):
        if not _whole(h) or h < 1:
            _fail(f"periods[{i}]", h, "every sync period must be a whole number of local steps >= 1")
    if periods[-1] != 1:
        _fail("periods", list(periods), "the last phase is synchronous: end the list with 1, e.g. [8, 2, 1]")


def _check_thresholds(thresholds: Any, phases: int) -> None:
    if not isinstance(thresholds, (list, tuple)) or len(thresholds) != phases - 1:
        _fail("plateau_thresholds", thresholds, f"give {phases - 1} threshold(s), one per phase but the last "
              f"(periods has {phases})")
    for i, t in enumerate(thresholds):
        if not _number(t) or not 0 < t < 1:
            _fail(f"plateau_thresholds[{i}]", t, "every threshold is a relative change in (0, 1), e.g. 0.05")
    for i in range(1, len(thresholds)):
        if thresholds[i] >= thresholds[i - 1]:
            _fail(f"plateau_thresholds[{i}]", thresholds[i], f"thresholds must decrease (a later phase waits for a "
                  f"flatter loss); it is not below plateau_thresholds[{i - 1}]={thresholds[i - 1]!r}")
