"""The figures of a run, one definition each: step time, balance, ideal throughput, fast-rank idle.

The runtime's timer, ``hetero-strategy demo`` and every benchmark compute them here (pure
functions of measured times; the ideal is the cost model's, :mod:`hetero_strategy.cluster.cost`).

Definitions, for ranks r = 1..W with batch b_r, global batch G = Σ b_r:

* **step time** T: the median, over the measured steps, of the time from one step's start to the
  next's (every rank steps together under synchronous training, so one rank's clock serves).
* **compute time** c_r: rank r's time from its step's start to its last gradient, waiting for
  peers excluded (the median over the measured steps).
* **balance** = 1 − (max_r c_r − min_r c_r) / max_r c_r: 1.0 when every rank finishes its
  compute together.
* **ideal** throughput = G / (G / Σ_r s_r + t_ar), s_r rank r's samples/s alone, t_ar a bare
  all-reduce of the gradient: a perfectly balanced step that hides no communication.
* **fast rank**: the rank with the least compute time per sample, c_r / b_r.
* **fast-rank idle** = max(0, T − c_fast) / T: the share of its step the fast rank does not
  compute — it waits for slower peers, and for communication its compute does not hide.

Why idle is defined so (and not, as ``bench balance`` did before, as the part of T beyond both
c_fast and a separately measured bare all-reduce t_ar): it needs nothing but the run's own clock,
so the runtime, the demo and every benchmark give the same figure for the same run; and a bare
all-reduce is not what an overlapped step pays (DDP starts it during backward), so subtracting
it under-counted the idle time and clamped it to 0. What balancing cannot remove, the exposed
communication, shows in throughput against the ideal, which includes t_ar.

Example::

    fast_rank_idle(step_s=1.0, compute_s=[0.4, 0.8], batch_sizes=[30, 10])   # 0.6: rank 0 is fast
    balance([0.4, 0.8])                                                       # 0.5
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from hetero_strategy.cluster.cost import ideal_samples_per_s

__all__ = ["balance", "fast_rank", "fast_rank_idle", "ideal_samples_per_s", "idle_fraction", "median_step"]


def median_step(starts: Sequence[float], last: int) -> float:
    """T: the median time from one step's start to the next over the last ``last`` steps."""
    return statistics.median([b - a for a, b in itertools.pairwise(starts)][-last:])


def balance(compute_s: Sequence[float]) -> float:
    """1 - (max c - min c) / max c over per-rank compute times (1.0 when all are zero)."""
    hi = max(compute_s)
    return 1.0 - (hi - min(compute_s)) / hi if hi > 0 else 1.0


def fast_rank(compute_s: Sequence[float], batch_sizes: Sequence[int]) -> int:
    """The rank with the least compute time per sample (the first of equals)."""
    return min(range(len(compute_s)), key=lambda r: compute_s[r] / batch_sizes[r])


def idle_fraction(step_s: float, compute_s: float) -> float:
    """max(0, T - c) / T: the share of a step of length T spent not computing."""
    return max(0.0, step_s - compute_s) / step_s


def fast_rank_idle(step_s: float, compute_s: Sequence[float], batch_sizes: Sequence[int]) -> float:
    """Fast-rank idle: the fast rank's :func:`idle_fraction` of the step."""
    return idle_fraction(step_s, compute_s[fast_rank(compute_s, batch_sizes)])
