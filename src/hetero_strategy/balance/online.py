"""Online rebalancing: all-gather per-rank compute times at decision steps, apply the decision.

Timings are kept locally and exchanged only when a decision is due (one all-gather every
``recalibrate_every`` steps), so no collective is added to ordinary steps. Every rank feeds the
same gathered rows to its own :class:`Calibrator` and so schedules the same new split.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hetero_strategy.balance.sampler import HeteroBatchSampler
from hetero_strategy.dist import all_gather_floats

if TYPE_CHECKING:
    from hetero_strategy.balance.calibrator import Calibrator

__all__ = ["OnlineBalancer"]


class OnlineBalancer:
    """Glue between a step loop, a :class:`Calibrator` and a :class:`HeteroBatchSampler`.

    Example::

        balancer = OnlineBalancer(Calibrator(cfg, sampler.batch_sizes), sampler)
        for step, batch in enumerate(loader):
            ...  # forward, backward (timed until the last bucket reaches the hook), optimizer step
            balancer.step_end(step, compute_s, len(batch), step_s)
    """

    def __init__(self, calibrator: Calibrator, sampler: HeteroBatchSampler, accumulate: int = 1) -> None:
        self.calibrator = calibrator
        self.sampler = sampler
        # micro-batches per optimizer step: a new split starts with an accumulation window, since
        # the comm hook weights a window's summed gradient by its last micro-batch's b_r / G
        self.accumulate = max(1, int(accumulate))
        # (step, compute_s, local batch, step_s, CPU seconds after the last gradient, compute's pace)
        self._pending: list[tuple[float, ...]] = []

    def decision_due(self, step: int) -> bool:
        cfg = self.calibrator.config
        return step >= cfg.cold_start_steps and (step - cfg.cold_start_steps + 1) % cfg.recalibrate_every == 0

    def step_end(self, step: int, compute_s: float, local_batch: int, step_s: float | None = None,
                 after_cpu_s: float | None = None, pace: float | None = None) -> list[int] | None:
        """Record this rank's step; at a decision step, gather all ranks' rows and decide.

        ``step_s`` is this rank's whole step (communication included); the slowest rank's is the
        step's time, which the calibrator compares between plans. ``after_cpu_s`` and ``pace``: this
        rank's CPU seconds after its last gradient and its compute's wall seconds per CPU second
        (:class:`~hetero_strategy.runtime.timer.StepTimer`; None or nan: not measured), from
        which the calibrator counts each rank's own work after backward.

        Returns the new sizes (scheduled from the first step the sampler has not yielded yet) or None.
        """
        if step >= self.calibrator.config.cold_start_steps:
            self._pending.append((step, compute_s, float(local_batch), *map(_float, (step_s, after_cpu_s, pace))))
        if not self.decision_due(step):
            return None
        mine = [x for row in self._pending for x in row[1:]]
        rows = all_gather_floats(mine)  # every rank: [t0, b0, w0, a0, p0, t1, b1, ...] for the same steps
        decision = None
        for i, (s, *_) in enumerate(self._pending):
            times, batches, walls, cpu, pace = ([row[5 * i + k] for row in rows] for k in range(5))
            wall = math.nan if any(math.isnan(w) for w in walls) else max(walls)
            decision = self.calibrator.observe(int(s), times, [int(b) for b in batches], wall, cpu, pace) or decision
        self._pending.clear()
        if decision is not None:
            self.sampler.set_batch_sizes(decision, from_step=self._window_start(self.sampler.next_unyielded_step()))
        return decision

    def _window_start(self, step: int) -> int:
        """The first global step >= ``step`` that opens an accumulation window (windows restart each epoch)."""
        per_epoch = max(1, self.sampler.steps_per_epoch())
        while (step % per_epoch) % self.accumulate:
            step += 1
        return step

    def state_dict(self) -> dict:
        # the rows recorded since the last decision, so a resumed run decides as an uninterrupted one
        return {"calibrator": self.calibrator.state_dict(), "pending": [list(r) for r in self._pending]}

    def load_state_dict(self, state: dict) -> None:
        self.calibrator.load_state_dict(state["calibrator"])
        def row(r: list) -> tuple[float, ...]:  # older states lack the last one to three figures
            return tuple(float(x) for x in r[:6]) + (math.nan,) * (6 - len(r[:6]))

        self._pending = [row(r) for r in state.get("pending", [])]


def _float(value: float | None) -> float:
    return math.nan if value is None else float(value)
