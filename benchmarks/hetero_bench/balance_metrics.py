"""Figures of the balance benchmark from the per-rank JSON the workers wrote (pure functions).

Step time, balance, ideal and fast-rank idle are those of :mod:`hetero_strategy.runtime.metrics`
(definitions there). Here:

* r_i: rank i's solo samples/s (same training loop, one process, no communication); t_ar: a bare
  all-reduce of the model's gradient (slowest rank's median).
* compute times c_r are measured in the run (step start to its last gradient; on CPU this
  includes the cost of the overlapped all-reduce work on the rank's one core), or, where a run
  did not measure them, estimated from the solo speeds as b_r / r_r.
* ``fast_rank_idle_fraction_solo_estimate``: the same idle with the estimated c_r.
* ``gap``: where a step's time goes beyond the ideal's (G / Σ r + t_ar), as shares of the step
  (:func:`gap_shares`).
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from hetero_strategy.runtime.metrics import balance, fast_rank_idle, ideal_samples_per_s, median_step

__all__ = ["cycle_figures", "gap_shares", "mode_figures", "round_figures", "solo_figures"]


def _diffs(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


def solo_figures(ranks: list[dict], batch: int, skip: int = 3) -> dict[str, Any]:
    speeds = [batch / statistics.median(_diffs(r["starts"])[skip:]) for r in ranks]
    t_ar = max(statistics.median(r["ar_times"]) for r in ranks)  # the collective ends with its slowest rank
    return {"solo_samples_per_s": speeds, "t_ar_s": t_ar, "grad_bytes": ranks[0]["grad_bytes"]}


def gap_shares(step: float, sizes: list[int], compute: list[float], solo: dict[str, Any]) -> dict[str, float]:
    """A measured step against the ideal one, G / Σ r + t_ar, in shares of the step that sum to 1:

    * ``ideal``: the ideal step;
    * ``slowdown``: the ranks compute slower in the run than alone: P x (s - 1), with P = G / Σ r the
      compute of a perfect split at solo speeds and s the mean of c_r / (b_r / r_r) (on one CPU core
      the overlapped all-reduce's own work; a batch's fixed cost amortised differently);
    * ``imbalance``: the slowest rank's compute beyond a perfect split at those in-run speeds,
      max c_r - P x s (the split's misprediction and its rounding to whole samples);
    * ``after_backward``: what follows the last gradient beyond a bare all-reduce, step - max c_r - t_ar
      (the exchange's exposed part over t_ar, the optimizer's step, the next batch's loading).
    """
    speeds, t_ar = solo["solo_samples_per_s"], solo["t_ar_s"]
    perfect = sum(sizes) / sum(speeds)
    s = statistics.fmean(c / (b / r) for c, b, r in zip(compute, sizes, speeds) if b > 0)
    parts = {"ideal": perfect + t_ar, "slowdown": perfect * (s - 1.0), "imbalance": max(compute) - perfect * s,
             "after_backward": step - max(compute) - t_ar}
    return {k: v / step for k, v in parts.items()}


def mode_figures(ranks: list[dict], solo: dict[str, Any], measure: int) -> dict[str, Any]:
    """Throughput, sizes, fast-rank idle and balance over the last ``measure`` steps of one mode."""
    speeds = solo["solo_samples_per_s"]
    step = median_step(ranks[0]["starts"], measure)
    sizes = [int(statistics.median(r["batches"][-measure:])) for r in ranks]
    g = sum(sizes)
    estimate = [b / s for b, s in zip(sizes, speeds)]  # compute time predicted by the solo speeds
    measured = all("compute_s" in r for r in ranks)
    if measured:  # measured in the run (waiting for peers excluded)
        compute = [statistics.median(r["compute_s"][-measure:]) for r in ranks]
    else:
        compute = estimate
    out = {"samples_per_s": g / step, "step_s": step, "batch_sizes": sizes,
           "fast_rank_idle_fraction": fast_rank_idle(step, compute, sizes),
           "fast_rank_idle_fraction_solo_estimate": fast_rank_idle(step, estimate, sizes),
           "compute_s": compute, "balance": balance(compute)}
    if measured:
        out["gap"] = gap_shares(step, sizes, compute, solo)
    for key in ("decisions", "after_backward_s"):  # the calibrator's view: the same on every rank
        if key in ranks[0]:
            out[key] = ranks[0][key]
    return out


def round_figures(solo: dict[str, Any], modes: dict[str, dict[str, Any]], global_batch: int) -> dict[str, Any]:
    ideal = ideal_samples_per_s(global_batch, solo["solo_samples_per_s"], solo["t_ar_s"])
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


def cycle_figures(arms: list[dict], global_batch: int) -> list[dict[str, Any]]:
    """The cycle's arms (sizes, per-block step times) -> sizes, median step and samples/s each
    (``sizes`` None: plain DDP at equal batches)."""
    out = []
    for arm in arms:
        step = statistics.median(arm["step_s"])
        out.append({"sizes": arm["sizes"], "step_s": step, "samples_per_s": global_batch / step,
                    "block_step_s": list(arm["step_s"])})
    return out
