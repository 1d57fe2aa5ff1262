"""Figures of the balance benchmark from the per-rank JSON the workers wrote (pure functions).

Definitions (issue 3):

* r_i: rank i's solo samples/s (same training loop, one process, no communication).
* t_ar: a bare all-reduce of the model's gradient.
* ideal = G / (G / sum_i r_i + t_ar): a perfectly balanced step that hides no communication.
* fast-rank idle = share of the fast rank's step spent waiting beyond its compute and t_ar:
  max(0, T - c_fast - t_ar) / T, with c_fast the fast rank's compute time measured in the run
  (step start to its last gradient; on CPU this includes the cost of the overlapped all-reduce
  work on the rank's one core). The solo-speed estimate c_fast = b_fast / r_fast is kept too.
* balance = 1 - (max_r c_r - min_r c_r) / max_r c_r over per-rank compute times c_r.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

__all__ = ["median_step", "mode_figures", "round_figures", "solo_figures"]


def _diffs(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


def median_step(starts: list[float], measure: int) -> float:
    """Median time from one step's start to the next over the last ``measure`` steps."""
    return statistics.median(_diffs(starts)[-measure:])


def solo_figures(ranks: list[dict], batch: int, skip: int = 3) -> dict[str, Any]:
    speeds = [batch / statistics.median(_diffs(r["starts"])[skip:]) for r in ranks]
    t_ar = max(statistics.median(r["ar_times"]) for r in ranks)  # the collective ends with its slowest rank
    return {"solo_samples_per_s": speeds, "t_ar_s": t_ar, "grad_bytes": ranks[0]["grad_bytes"]}


def mode_figures(ranks: list[dict], solo: dict[str, Any], measure: int) -> dict[str, Any]:
    """Throughput, sizes, fast-rank idle and balance over the last ``measure`` steps of one mode."""
    speeds, t_ar = solo["solo_samples_per_s"], solo["t_ar_s"]
    step = median_step(ranks[0]["starts"], measure)
    sizes = [int(statistics.median(r["batches"][-measure:])) for r in ranks]
    g = sum(sizes)
    fast = max(range(len(speeds)), key=lambda k: speeds[k])
    estimate = [b / s for b, s in zip(sizes, speeds)]  # compute time predicted by the solo speeds
    if all("compute_s" in r for r in ranks):  # measured in the run (waiting for peers excluded)
        compute = [statistics.median(r["compute_s"][-measure:]) for r in ranks]
    else:
        compute = estimate
    out = {"samples_per_s": g / step, "step_s": step, "batch_sizes": sizes,
           "fast_rank_idle_fraction": max(0.0, step - compute[fast] - t_ar) / step,
           "fast_rank_idle_fraction_solo_estimate": max(0.0, step - estimate[fast] - t_ar) / step,
           "compute_s": compute, "balance": 1.0 - (max(compute) - min(compute)) / max(compute)}
    if "decisions" in ranks[0]:
        out["decisions"] = ranks[0]["decisions"]
    return out


def round_figures(solo: dict[str, Any], modes: dict[str, dict[str, Any]], global_batch: int) -> dict[str, Any]:
    ideal = global_batch / (global_batch / sum(solo["solo_samples_per_s"]) + solo["t_ar_s"])
    out = dict(solo, ideal_samples_per_s=ideal)
    for name, m in modes.items():
        out[f"{name}_samples_per_s"] = m["samples_per_s"]
        out[f"{name}_vs_ideal"] = m["samples_per_s"] / ideal
        out[f"fast_rank_idle_fraction_{name}"] = m["fast_rank_idle_fraction"]
        out[f"fast_rank_idle_fraction_{name}_solo_estimate"] = m["fast_rank_idle_fraction_solo_estimate"]
        out[f"balance_{name}"] = m["balance"]
        if name != "ddp" and "ddp" in modes:
            out[f"{name}_speedup_vs_ddp"] = m["samples_per_s"] / modes["ddp"]["samples_per_s"]
    out["modes"] = modes
    return out
