"""Figures of the balance benchmark from the per-rank JSON the workers wrote (pure functions).

Step time, balance, ideal and fast-rank idle are those of :mod:`hetero_strategy.runtime.metrics`
(definitions there). Here:

* r_i: rank i's solo samples/s (same training loop, one process, no communication); t_ar: a bare
  all-reduce of the model's gradient (slowest rank's median).
* compute times c_r are measured in the run (step start to its last gradient; on CPU this
  includes the cost of the overlapped all-reduce work on the rank's one core), or, where a run
  did not measure them, estimated from the solo speeds as b_r / r_r.
* ``fast_rank_idle_fraction_solo_estimate``: the same idle with the estimated c_r.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from hetero_strategy.runtime.metrics import balance, fast_rank_idle, ideal_samples_per_s, median_step

__all__ = ["mode_figures", "round_figures", "solo_figures"]


def _diffs(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


def solo_figures(ranks: list[dict], batch: int, skip: int = 3) -> dict[str, Any]:
    speeds = [batch / statistics.median(_diffs(r["starts"])[skip:]) for r in ranks]
    t_ar = max(statistics.median(r["ar_times"]) for r in ranks)  # the collective ends with its slowest rank
    return {"solo_samples_per_s": speeds, "t_ar_s": t_ar, "grad_bytes": ranks[0]["grad_bytes"]}


def mode_figures(ranks: list[dict], solo: dict[str, Any], measure: int) -> dict[str, Any]:
    """Throughput, sizes, fast-rank idle and balance over the last ``measure`` steps of one mode."""
    speeds = solo["solo_samples_per_s"]
    step = median_step(ranks[0]["starts"], measure)
    sizes = [int(statistics.median(r["batches"][-measure:])) for r in ranks]
    g = sum(sizes)
    estimate = [b / s for b, s in zip(sizes, speeds)]  # compute time predicted by the solo speeds
    if all("compute_s" in r for r in ranks):  # measured in the run (waiting for peers excluded)
        compute = [statistics.median(r["compute_s"][-measure:]) for r in ranks]
    else:
        compute = estimate
    out = {"samples_per_s": g / step, "step_s": step, "batch_sizes": sizes,
           "fast_rank_idle_fraction": fast_rank_idle(step, compute, sizes),
           "fast_rank_idle_fraction_solo_estimate": fast_rank_idle(step, estimate, sizes),
           "compute_s": compute, "balance": balance(compute)}
    if "decisions" in ranks[0]:
        out["decisions"] = ranks[0]["decisions"]
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
