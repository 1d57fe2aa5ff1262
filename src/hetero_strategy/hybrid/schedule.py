"""The phase schedule of hybrid training: which sync period H applies, and when to move on.

Rule (every rank decides alike, from the mean validation loss over ranks):

1. Each evaluation appends the all-reduced mean validation loss L to the current phase's history.
2. With N = ``plateau_evals``, once the phase holds N + 1 losses the relative change is
   ``|L[-1] - L[-1-N]| / |L[-1-N]|`` (0 when both are 0; infinite when only the old one is 0).
3. Below ``plateau_thresholds[phase]``: move to the next phase, clear the history (the new
   phase's first N evaluations only collect), and log the switch on rank 0.

The last phase (H = 1, synchronous) never ends and needs no collective.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import HybridConfig
from hetero_strategy.dist import device_for

__all__ = ["PhaseSchedule", "relative_change"]

# mean(value) over ranks; the default all-reduces over the default group (identity on one process)
Reduce = Callable[[float], float]


def relative_change(new: float, old: float) -> float:
    """``|new - old| / |old|``, with a flat zero loss counting as no change."""
    if old == 0:
        return 0.0 if new == 0 else math.inf
    return abs(new - old) / abs(old)


def _mean_over_ranks(value: float, group: Any = None) -> float:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return float(value)
    # NOTE: fp64, so the mean is the same on every rank whatever the summation order's rounding
    t = torch.tensor([float(value)], dtype=torch.float64, device=device_for(group))  # NCCL: CUDA tensors only
    dist.all_reduce(t, group=group)
    return float(t.item()) / dist.get_world_size(group)


class PhaseSchedule:
    """Phase index, its sync period, and the validation-loss history that ends it.

    Args:
        config: the ``hybrid`` section.
        info: where a switch is logged (the runtime passes a rank-0-only logger).
        reduce: mean of a float over ranks (default: an fp64 all-reduce on the default group).

    Example::

        schedule = PhaseSchedule(HybridConfig(mode="hybrid"), print)
        schedule.period      # 8
        schedule.evaluated(val_loss)   # on every rank, at every evaluation: True when it switched
    """

    __slots__ = ("config", "history", "info", "phase", "reduce", "switches")

    def __init__(self, config: HybridConfig, info: Callable[[str], None], reduce: Reduce | None = None) -> None:
        self.config = config
        self.info = info
        self.reduce = reduce or _mean_over_ranks
        self.phase = 0
        self.history: list[float] = []
        self.switches: list[dict[str, Any]] = []  # (evaluation index, old and new phase): for logs and tests

    @property
    def period(self) -> int:
        return self.config.periods[self.phase]

    @property
    def synchronous(self) -> bool:
        """The last phase: plain DDP (every earlier one averages models, even with H = 1)."""
        return self.phase == len(self.config.periods) - 1

    def evaluated(self, val_loss: float) -> bool:
        """Record one evaluation (collective outside the last phase); True when the phase changed."""
        if self.synchronous:
            return False
        loss = self.reduce(float(val_loss))
        self.history.append(loss)
        n = self.config.plateau_evals
        if len(self.history) <= n:
            return False
        change = relative_change(self.history[-1], self.history[-1 - n])
        threshold = self.config.plateau_thresholds[self.phase]
        if not change < threshold:
            return False
        old = self.period
        self.phase += 1
        self.history = []
        self.switches.append({"phase": self.phase, "loss": loss, "change": change})
        self.info(f"hetero: hybrid phase {self.phase - 1} -> {self.phase}: sync period {old} -> {self.period} "
                  f"(mean val loss {loss:.6g}, relative change {change:.3%} over {n} evaluations < {threshold:.3%})")
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "history": list(self.history), "switches": list(self.switches)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.phase = int(state["phase"])
        self.history = [float(x) for x in state["history"]]
        self.switches = list(state.get("switches", []))
