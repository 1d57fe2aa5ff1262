"""What a step with a NaN/inf gradient does: ``nonfinite="skip" | "stop"`` (issue 13).

A non-finite gradient on any rank makes the *reduced* gradient non-finite on every rank (an
all-reduce spreads it; the compressed hooks mark the whole bucket NaN), so one check of the
reduced gradient, the same on every rank, decides alike everywhere without a collective:

* ``skip``: every rank drops the step (the gradients are cleared, the optimizer does not step),
  counts it and logs it; parameters stay identical across ranks.
* ``stop``: every rank raises :class:`NonFiniteError` with the step and the rank(s) whose own
  gradient was non-finite. To know them, each hook call first notes whether its bucket (this
  rank's gradient, before the reduction) is finite: one device reduction per bucket, no host
  sync, only in this mode. An fp16 rank's overflow under ``precision_policy`` is not an error:
  loss scaling skips the step and backs its scale off; ``stop`` fires when any *other* rank
  produced the NaN/inf.

Example::

    guard = NonFiniteGuard("stop")
    ddp.register_comm_hook(state, guard.wrap_hook(hook))
    ...
    if CoordinatedScaler.found_inf(params):          # the reduced gradient, the same on every rank
        guard.on_nonfinite(step, scaled=False)      # raises NonFiniteError, or counts a skip
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from hetero_strategy.dist import all_gather_floats

__all__ = ["NonFiniteError", "NonFiniteGuard"]

log = logging.getLogger("hetero_strategy")


class NonFiniteError(FloatingPointError):
    """``nonfinite="stop"``: a step's gradient held a NaN/inf; raised on every rank alike."""


class NonFiniteGuard:
    """This rank's handling of non-finite steps: the skip count, and in ``stop`` mode its own flags."""

    def __init__(self, action: str, warn: Callable[[str], None] = log.warning) -> None:
        self.action, self._warn = action, warn
        self.skipped = 0
        self._local: list[torch.Tensor] = []  # per bucket of this step: 0-d bool, "not finite"

    def wrap_hook(self, hook: Callable) -> Callable:
        """``hook`` noting first whether this rank's bucket is finite (``stop`` only: it costs a pass)."""
        if self.action != "stop":
            return hook
        local = self._local

        # NOTE: DDP looks the parameter up by the name "bucket"; without annotations it checks no types
        def noting(state, bucket):
            local.append(torch.isfinite(bucket.buffer()).all().logical_not())
            return hook(state, bucket)

        return noting

    def new_step(self) -> None:
        """A new batch begins: forget the last step's per-bucket flags."""
        self._local.clear()

    def on_nonfinite(self, step: int, scaled: bool) -> None:
        """The reduced gradient of ``step`` is non-finite (every rank calls this alike).

        ``scaled``: this rank scales its loss (fp16 under ``precision_policy``). Raises
        :class:`NonFiniteError` under ``stop`` unless only loss-scaled ranks overflowed; else
        counts and logs the skip (the caller drops the step).
        """
        if self.action == "stop":
            mine = bool(torch.stack(self._local).any()) if self._local else False
            rows = all_gather_floats([1.0 if mine else 0.0, 1.0 if scaled else 0.0])  # collective, all alike
            culprits = [r for r, (bad, _) in enumerate(rows) if bad]
            if not culprits or any(not rows[r][1] for r in culprits):
                who = (f"rank(s) {', '.join(map(str, culprits))}" if culprits
                       else "no rank's own gradient (it turned non-finite in the reduction)")
                raise NonFiniteError(f"hetero: the gradient of step {step} is not finite (NaN/inf), produced by "
                                     f"{who}; stopping every rank (nonfinite='stop'). Use nonfinite='skip' to drop "
                                     "such steps and go on, or lower the learning rate / check the inputs")
            return  # only loss-scaled ranks overflowed: the scaler skips and backs off, as usual
        self.skipped += 1
        self._warn(f"hetero: step {step} skipped on every rank: its gradient is not finite (NaN/inf); "
                   f"{self.skipped} skipped so far")
