"""The reliability section: what a non-finite gradient does, and when a silent peer is an error."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetero_strategy.config.errors import _fail, _number, _whole

__all__ = ["NONFINITE_ACTIONS", "RESUME_MODES", "ReliabilityConfig"]

NONFINITE_ACTIONS = ("skip", "stop")
RESUME_MODES = ("auto", "never")


@dataclass(kw_only=True, slots=True)
class ReliabilityConfig:
    """Failure handling (docs/design.md semantics 11); see docs/reliability.md."""

    nonfinite: str = "skip"
    """A step whose reduced gradient holds a NaN/inf: ``skip`` it on every rank (counted and
    logged; parameters stay identical across ranks) or ``stop`` every rank with the step and the
    rank(s) that produced it. An fp16 rank's overflow under ``precision_policy`` always skips and
    backs the loss scale off: that is how loss scaling works."""
    stall_timeout_s: float = 60.0
    """Seconds a rank may wait for its peers in one collective before every rank raises an error
    naming the silent rank (when known), the phase and the step; the process group's timeout.
    Raise it for steps that legitimately keep peers waiting longer (a long rank-0-only eval)."""
    checkpoint_dir: str | None = None
    """Directory of periodic checkpoints (every rank writes its own shard, asynchronously; on
    several nodes a directory they all see). None: no periodic checkpoints."""
    checkpoint_every_steps: int | None = None
    """Save every this many optimizer steps (None: by time only)."""
    checkpoint_every_s: float | None = 300.0
    """Save when this many seconds passed since the last save (None: by steps only)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept, newest first; older ones are removed after each save."""
    resume: str = "auto"
    """``auto``: start from the newest complete checkpoint in ``checkpoint_dir`` when there is
    one (an elastic restart continues where the job died); ``never``: always start fresh."""

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE_ACTIONS:
            _fail("nonfinite", self.nonfinite, f"choose one of {', '.join(NONFINITE_ACTIONS)}")
        if not _number(self.stall_timeout_s) or self.stall_timeout_s < 1:
            _fail("stall_timeout_s", self.stall_timeout_s, "give the seconds a peer may stay silent, at least 1 "
                  "(e.g. 60)")
        if self.checkpoint_dir is not None and (not isinstance(self.checkpoint_dir, str) or not self.checkpoint_dir):
            _fail("checkpoint_dir", self.checkpoint_dir, "give a directory path, or None for no periodic checkpoints")
        if self.checkpoint_every_steps is not None and (not _whole(self.checkpoint_every_steps)
                                                        or self.checkpoint_every_steps < 1):
            _fail("checkpoint_every_steps", self.checkpoint_every_steps, "give a whole number of steps >= 1, or None")
        if self.checkpoint_every_s is not None and (not _number(self.checkpoint_every_s)
                                                    or not math.isfinite(self.checkpoint_every_s)
                                                    or self.checkpoint_every_s <= 0):
            _fail("checkpoint_every_s", self.checkpoint_every_s, "give seconds > 0 (e.g. 300), or None")
        if self.checkpoint_dir is not None and self.checkpoint_every_steps is None and self.checkpoint_every_s is None:
            _fail("checkpoint_every_s", None, "with checkpoint_dir set, give checkpoint_every_steps or "
                  "checkpoint_every_s (or both): otherwise nothing is ever saved")
        if not _whole(self.keep_checkpoints) or self.keep_checkpoints < 1:
            _fail("keep_checkpoints", self.keep_checkpoints, "keep at least 1 complete checkpoint (e.g. 2)")
        if self.resume not in RESUME_MODES:
            _fail("resume", self.resume, f"choose one of {', '.join(RESUME_MODES)}")
