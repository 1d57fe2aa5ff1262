"""Online calibration of per-rank batch sizes toward equal finishing times (docs/design.md semantics 5).

Every rank feeds the *same* all-gathered timings into its own :class:`Calibrator`, which is a pure
function of them, so every rank reaches the same decision without another collective.

Algorithm, at each decision step (after ``cold_start_steps``, then every ``recalibrate_every``):

1. Keep the recent steps (at most ``window``) that ran with the current sizes; each gives every
   rank's compute time (waiting for peers excluded) for its batch b_r.
2. Speed s_r = b_r / (median(compute time of r) - f_r): the median shrugs off one-off stalls (GC,
   I/O); f_r is the rank's fixed cost per step from the start-up probe's affine fit
   (``fixed_s``; 0 without one), the same step-cost model the static plan used.
3. Target: the sizes at which f_r + a_r + b_r / s_r is equal on every rank, summing to G, each
   >= 1 (with all f_r, a_r = 0, sizes proportional to speed). Without f_r a rank with a large
   fixed cost looks slower per sample than it is, and the split overshoots away from it. a_r is
   a rank's own work after its last gradient (the exchange's tail it computes itself, the
   optimizer's step): the median over the window of the ranks' mean CPU seconds after their last
   gradient, at the rank's own pace (wall seconds per CPU second of its compute), at most its
   median compute. On one CPU core per rank that work is the same on every rank (a ring reduces
   as much everywhere; the optimizer steps the same weights) and a slow core pays it slower, so a
   split that equalises compute alone leaves the slow rank the last to finish (bench balance's
   1.0 / 0.57 cluster: 4-9 samples on the slow side of the best split). The mean, not each rank's
   own: a rank that finishes backward first reduces its earlier buckets after its last gradient,
   beside the peer's backward, and its own reading would count that. A rank where it is not
   measured (a GPU, FSDP's reduction) counts 0; with no rank measured, a_r is 0 everywhere.
4. Move from the current sizes toward the target by the largest fraction lam <= 1 that keeps every
   rank within +-max_change of its current size (at least one sample). Sizes and target both sum
   to G, so every point on the way does too.
5. Round with :func:`split_batch` (largest remainder; each b_r >= 1, capped at the upper bound).

The model predicts compute and the ranks' own work after it; a step also pays communication and
contention it cannot see. So
each decision first compares the *measured* step time (median, slowest rank) of the current plan
with the fastest plan measured so far. A plan slower beyond the noise of both medians
(:func:`~hetero_strategy.balance.timing.equal_within_noise` on their standard errors, from half
the steps' interquartile range over sqrt(steps); each band at least 1%) is undone: one move
(within +-max_change) back toward the fastest plan. (With a plain 1%, steps that vary by 10% undid
the first, right move from equal shares in 2 of 5 runs, which then stayed there.)
Until the rejection expires, no move heads toward the undone plan and ends nearer to it than to
the fastest one (so a plan a sample beside it is not tried instead); moves in other directions
stay free. A rejection lasts ``_FORGET_AFTER``
decisions, twice that each time the same plan is undone again (at most 8 times); a measurement
that contradicts an older one (the fastest plan is the one undone before) replaces it. A run that
starts from the probe's plan therefore does not settle on one slower beyond that noise.

Example::

    cal = Calibrator(CalibrationConfig(calibrate=True, recalibrate_every=20, window=20), [128, 128])
    for step in range(200):
        times = [b / s for b, s in zip(cal.sizes, [1.0, 0.57])]   # rank 1 is 1.75x slower
        new = cal.observe(step, times, cal.sizes)
        if new is not None:
            sampler.set_batch_sizes(new, from_step=step + 1)
    cal.sizes  # -> about [163, 93]
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

from hetero_strategy.balance.shares import least_share, split_batch, split_batch_timed
from hetero_strategy.balance.timing import equal_within_noise, relative_spread
from hetero_strategy.config import CalibrationConfig

__all__ = ["Calibrator"]

# A row: per-rank compute times, per-rank sizes, the step's wall time (or nan), per-rank own work
# after the last gradient (or None).
_Row = tuple[tuple[float, ...], tuple[int, ...], float, tuple[float, ...] | None]

# Decisions whose predicted finishing times already agree within this spread change nothing: a
# +-1 sample jitter from timing noise would only churn the plan.
_DEADBAND = 0.02
# Fewest steps with the current sizes that a decision needs (the window may be longer).
_MIN_ROWS = 5
# A plan whose median step is slower than the fastest measured plan's beyond both plans' noise
# bands, each at least this wide, is undone.
_WORSE = 0.01
# Decisions after which an undone plan may be tried again (the cluster's speeds may have drifted,
# or a burst of slow steps made a right move look slower: bench balance's 90-step calibrated run
# then stayed at equal shares with 10); doubled each time the same plan is undone again, up to
# 2 ** _MAX_BACKOFF times.
_FORGET_AFTER = 4
_MAX_BACKOFF = 3


class Calibrator:
    """Decides new per-rank batch sizes from all-gathered per-rank compute times.

    Args:
        config: the :class:`CalibrationConfig` (cold start, period, window, max_change).
        initial_sizes: the static plan's sizes; their sum G never changes.
    """

    def __init__(self, config: CalibrationConfig, initial_sizes: Sequence[int],
                 fixed_s: Sequence[float] | None = None) -> None:
        sizes = [int(b) for b in initial_sizes]
        if not sizes or any(b < 1 for b in sizes):
            raise ValueError(f"initial_sizes={list(initial_sizes)!r} is invalid: give one size >= 1 per rank")
        if fixed_s is not None and (len(fixed_s) != len(sizes) or any(not f >= 0 for f in fixed_s)):
            raise ValueError(f"fixed_s={list(fixed_s)!r} is invalid: give one fixed cost >= 0 per rank")
        self.fixed_s = [0.0] * len(sizes) if fixed_s is None else [float(f) for f in fixed_s]
        self.config = config
        self.sizes: list[int] = sizes
        self.global_batch = sum(sizes)
        self.rows: deque[_Row] = deque(maxlen=config.window)
        self.decisions: list[tuple[int, list[int]]] = []  # (step, new sizes), for logs and tests
        self.measured: dict[tuple[int, ...], tuple[float, float]] = {}  # plan -> (median step time, its spread)
        # (undone plan, the fastest plan it lost to, decision count when the rejection expires)
        self.rejected: list[tuple[tuple[int, ...], tuple[int, ...], int]] = []
        self._decision_count = 0
        self._strikes: dict[tuple[int, ...], int] = {}  # plan -> times undone (the latest 32 plans)

    def observe(self, step: int, per_rank_compute_s: Sequence[float], per_rank_batch: Sequence[int],
                step_s: float | None = None, per_rank_after_cpu_s: Sequence[float] | None = None,
                per_rank_pace: Sequence[float] | None = None) -> list[int] | None:
        """Record step ``step``'s timings; returns the new sizes when a decision changes them.

        ``per_rank_batch`` are the sizes this step really ran with (the strategy applies a decision
        from a later step, so rows from before it took effect are recognised and skipped).
        ``step_s`` is the step's measured time (the slowest rank's, communication included); without
        it plans are chosen by the compute model alone. ``per_rank_after_cpu_s`` and ``per_rank_pace``
        (each rank's CPU seconds after its last gradient and its compute's wall seconds per CPU
        second; nan where not measured) give the own work after backward (step 3 above).
        """
        n = len(self.sizes)
        if len(per_rank_compute_s) != n or len(per_rank_batch) != n:
            raise ValueError(f"per_rank_compute_s={list(per_rank_compute_s)!r} is invalid: expected {n} entries "
                             "(one per rank, all-gathered)")
        cfg = self.config
        if step < cfg.cold_start_steps:
            return None  # warm-up steps (allocator, caches, autotuning) would mislead the estimate
        times = tuple(float(t) for t in per_rank_compute_s)
        batch = tuple(int(b) for b in per_rank_batch)
        wall = float(step_s) if step_s is not None and math.isfinite(step_s) and step_s > 0 else math.nan
        after = _own_work_after(per_rank_after_cpu_s, per_rank_pace, n)
        if all(math.isfinite(t) and t > 0 for t in times) and sum(batch) == self.global_batch:
            self.rows.append((times, batch, wall, after))
        if (step - cfg.cold_start_steps + 1) % cfg.recalibrate_every != 0:
            return None
        new = self._decide()
        if new is None or new == self.sizes:
            return None
        self.sizes = new
        self.decisions.append((step, list(new)))
        return list(new)

    def _decide(self) -> list[int] | None:
        current = tuple(self.sizes)
        rows = [r[0] for r in self.rows if r[1] == current]
        if len(rows) < _MIN_ROWS:
            return None
        self._decision_count += 1
        self.rejected = [r for r in self.rejected if r[2] > self._decision_count]
        best = self._fastest_if_slower(current)
        if best is not None:
            return self._move_toward(best)
        n = len(current)
        median = [statistics.median(r[k] for r in rows) for k in range(n)]
        # NOTE: at most the rank's compute: a pace read over a compute that waited (a collective in
        # forward) would make it explode
        after = [min(a, m) for a, m in zip(self.after_backward(), median)]
        finish = [m + a for m, a in zip(median, after)]
        if (max(finish) - min(finish)) / max(finish) <= _DEADBAND:
            return None
        # NOTE: a probed fixed cost above half the measured step is not believed (the probe ran on
        # other batch sizes, maybe a cold cache); it would make the per-sample speed explode.
        fixed = [min(self.fixed_s[k], 0.5 * median[k]) for k in range(n)]
        speed = [current[k] / (median[k] - fixed[k]) for k in range(n)]
        # Target in whole samples with every rank >= 1 (a continuous target below 1 would pin a
        # rank at its floor and block every move).
        new = self._move_toward(split_batch_timed(self.global_batch, speed, [f + a for f, a in zip(fixed, after)],
                                                  min_per_rank=least_share(self.global_batch, n)))
        return None if self._blocked(new) else new

    def after_backward(self) -> list[float]:
        """Each rank's median own work after its last gradient over the window's rows (every plan's:
        it does not grow with the batch); zeros where no row carries it."""
        rows = [r[3] for r in self.rows if r[3] is not None]
        return [statistics.median(a[k] for a in rows) if rows else 0.0 for k in range(len(self.sizes))]

    def _move_toward(self, target: Sequence[float]) -> list[int]:
        """The largest step from the current sizes toward ``target`` that keeps every rank within
        +-max_change (target and sizes both sum to G, so every point on the way does too)."""
        current, n = self.sizes, len(self.sizes)
        lo, hi = self._bounds()
        lam = 1.0
        for k in range(n):
            delta = target[k] - current[k]
            room = hi[k] - current[k] if delta > 0 else current[k] - lo[k]
            if abs(delta) > 1e-12:
                lam = min(lam, max(room, 0) / abs(delta))
        moved = [current[k] + lam * (target[k] - current[k]) for k in range(n)]
        return split_batch(self.global_batch, moved, max_per_rank=hi)

    def _blocked(self, new: Sequence[int]) -> bool:
        """Whether the move to ``new`` heads toward an undone plan and ends nearer to it than to the
        plan it lost to."""
        def dist2(a: Sequence[int], b: Sequence[int]) -> int:
            return sum((x - y) ** 2 for x, y in zip(a, b))

        for undone, base, _ in self.rejected:
            heading = sum((x - c) * (u - c) for x, c, u in zip(new, self.sizes, undone))
            if heading > 0 and dist2(new, undone) < dist2(new, base):
                return True
        return False

    def _fastest_if_slower(self, current: tuple[int, ...]) -> tuple[int, ...] | None:
        """Record the current plan's measured step time; the fastest plan if this one is slower."""
        walls = [r[2] for r in self.rows if r[1] == current and not math.isnan(r[2])]
        if len(walls) < _MIN_ROWS:
            return None
        # the median's noise, not one step's: about 1.86 x half the IQR / sqrt(n) for normal noise
        self.measured[current] = (statistics.median(walls), 1.86 * relative_spread(walls) / math.sqrt(len(walls)))
        best = min(self.measured, key=lambda p: self.measured[p][0])
        # bounded: only the plans a later decision can still compare against are kept
        self.measured = {p: t for p, t in self.measured.items() if p in (best, current)}
        (mine, my_spread), (fastest, its_spread) = self.measured[current], self.measured[best]
        if best == current or equal_within_noise([mine, fastest], [my_spread, its_spread], floor=_WORSE):
            return None
        # a fresh measurement overrides an older verdict against the plan now found faster
        self.rejected = [r for r in self.rejected if r[0] != best]
        strikes = self._strikes.pop(current, 0) + 1
        self._strikes[current] = strikes
        self._strikes = dict(list(self._strikes.items())[-32:])
        life = _FORGET_AFTER * 2 ** min(strikes - 1, _MAX_BACKOFF)
        self.rejected = [r for r in self.rejected if r[0] != current]
        self.rejected.append((current, best, self._decision_count + life))
        return best

    def _bounds(self) -> tuple[list[int], list[int]]:
        """Integer bounds of one move: within +-max_change, but always at least one sample of room."""
        m = self.config.max_change
        lo = [max(1, min(math.ceil(b * (1 - m) - 1e-9), b - 1)) for b in self.sizes]
        hi = [max(math.floor(b * (1 + m) + 1e-9), b + 1) for b in self.sizes]
        return lo, hi

    # ---- checkpointing -----------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"sizes": list(self.sizes),
                "rows": [[list(t), list(b), w, list(a) if a else None] for t, b, w, a in self.rows],
                "decisions": [[s, list(d)] for s, d in self.decisions],
                "measured": [[list(p), t, spread] for p, (t, spread) in self.measured.items()],
                "rejected": [[list(p), list(b), e] for p, b, e in self.rejected],
                "decision_count": self._decision_count, "strikes": [[list(p), k] for p, k in self._strikes.items()]}

    def load_state_dict(self, state: dict) -> None:
        sizes = [int(b) for b in state["sizes"]]
        if sum(sizes) != self.global_batch or len(sizes) != len(self.sizes):
            raise ValueError(f"sizes={sizes!r} in the calibrator state do not match this job "
                             f"({len(self.sizes)} ranks, global batch {self.global_batch})")
        self.sizes = sizes
        self.rows.clear()
        self.rows.extend((tuple(float(x) for x in row[0]), tuple(int(x) for x in row[1]),
                          float(row[2]) if len(row) > 2 else math.nan,
                          tuple(float(x) for x in row[3]) if len(row) > 3 and row[3] is not None else None)
                         for row in state["rows"])
        self.decisions = [(int(s), [int(x) for x in d]) for s, d in state.get("decisions", [])]
        # (a state from before the spread was kept compares its plans with the least band)
        self.measured = {tuple(int(x) for x in m[0]): (float(m[1]), float(m[2]) if len(m) > 2 else 0.0)
                         for m in state.get("measured", [])}
        # (entries of another shape, from an earlier format, are dropped: they only expire early)
        self.rejected = [(tuple(int(x) for x in r[0]), tuple(int(x) for x in r[1]), int(r[2]))
                         for r in state.get("rejected", []) if len(r) == 3]
        self._decision_count = int(state.get("decision_count", 0))
        self._strikes = {tuple(int(x) for x in p): int(k) for p, k in state.get("strikes", [])}


def _own_work_after(cpu: Sequence[float] | None, pace: Sequence[float] | None, n: int) -> tuple[float, ...] | None:
    """Each rank's own work after its last gradient in one step (step 3 of the module docstring):
    the ranks' mean CPU seconds at each one's pace; 0 where a rank measured none; None where none did."""
    if cpu is None or pace is None or len(cpu) != n or len(pace) != n:
        return None
    ok = [math.isfinite(c) and c >= 0 and math.isfinite(p) and p > 0 for c, p in zip(cpu, pace)]
    if not any(ok):
        return None
    mean_cpu = statistics.fmean(float(c) for c, k in zip(cpu, ok) if k)
    return tuple(mean_cpu * float(p) if k else 0.0 for p, k in zip(pace, ok))
