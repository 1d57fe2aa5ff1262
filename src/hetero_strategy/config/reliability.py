"""The reliability section: what a non-finite gradient does, and when a silent peer is an error."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hetero_strategy.config.errors import _fail

__all__ = ["NONFINITE_ACTIONS", "ReliabilityConfig"]

NONFINITE_ACTIONS = ("skip", "stop")


@dataclass(kw_only=True, slots=True)
class ReliabilityConfig:
    """Failure handling (DESIGN.md semantics 11); see docs/reliability.md."""

    nonfinite: str = "skip"
    """A step whose reduced gradient holds a NaN/inf: ``skip`` it on every rank (counted and
    logged; parameters stay identical across ranks) or ``stop`` every rank with the step and the
    rank(s) that produced it. An fp16 rank's overflow under ``precision_policy`` always skips and
    backs the loss scale off: that is how loss scaling works."""
    stall_timeout_s: float = 60.0
    """Seconds a rank may wait for its peers in one collective before every rank raises an error
    naming the silent rank (when known), the phase and the step; the process group's timeout.
    Raise it for steps that legitimately keep peers waiting longer (a long rank-0-only eval)."""

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE_ACTIONS:
            _fail("nonfinite", self.nonfinite, f"choose one of {', '.join(NONFINITE_ACTIONS)}")
        if not _number(self.stall_timeout_s) or not math.isfinite(self.stall_timeout_s) or self.stall_timeout_s < 1:
            _fail("stall_timeout_s", self.stall_timeout_s, "give the seconds a peer may stay silent, at least 1 "
                  "(e.g. 60)")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
