"""The balance benchmark's result JSON from its rounds, and its goals (pure functions).

A round holds every training's figures (``round_figures``) and, with ``--sweep``, its cycle's
(:mod:`.balance_cycle`: the fixed splits and the splits the trainings ended on, taking turns in one
launch): ``round["sweep"]``, one entry per swept split, and ``<training>_split_samples_per_s``.
Every figure is a median over rounds with its spread (min, max). The best split is the swept
split with the highest median throughput; the splits of the static and calibrated runs (and plain
DDP's) are judged against it in each round's cycle, and the median of those ratios is kept.

JSON keys scripts read stay as they were: ``ddp_samples_per_s``, ``hetero_samples_per_s``,
``hetero_cal_samples_per_s``, ``speedup_vs_ddp``, ...; this adds ``best_split``,
``best_split_samples_per_s`` and one ``<training>_samples_per_s`` per extra training.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from hetero_strategy.balance.shares import least_share, split_batch

__all__ = ["FRAMEWORKS", "MODELS", "TRAININGS", "goals", "spread", "summarise", "sweep_anchor", "sweep_splits"]

# What the worker can train (besides "solo" and "split"), and its models; here, not in the worker,
# because the worker imports Lightning and the command line must not.
TRAININGS = ("ddp", "ddp_powersgd", "hetero", "hetero_cal", "hetero_auto", "hetero_tiered", "hetero_codec")
MODELS = ("resnet18", "resnet18_l3")
FRAMEWORKS = ("lightning", "ddp")  # the worker's training loops: balance_fit_<framework>.py

# Legacy names (issue 3) of the static ("hetero") and calibrated ("hetero_cal") runs' figures.
_SUFFIX = {"hetero": "", "hetero_cal": "_calibrated"}


def sweep_splits(planned: Sequence[int], alphas: Sequence[float]) -> list[list[int]]:
    """Fixed splits on the line from the equal split (alpha 0) through ``planned`` (alpha 1).

    With 2 ranks this line is every split there is; with more it varies how far the plan leans
    toward the fast ranks, which is what a wrong speed estimate gets wrong. In increasing alpha;
    duplicates are dropped; a rank keeps at least :func:`~hetero_strategy.balance.least_share` samples.
    """
    g, n = sum(planned), len(planned)
    out: list[list[int]] = []
    for a in sorted(alphas):
        target = [max(1e-9, g / n + a * (b - g / n)) for b in planned]
        sizes = split_batch(g, target, min_per_rank=least_share(g, n))  # as the runtime's floor
        if sizes not in out:
            out.append(sizes)
    return out


def sweep_anchor(plans: Sequence[Sequence[int]]) -> list[int]:
    """The plan that leans furthest from the equal split (sum of squared differences): the sweep's
    alpha 1, so a sweep about it also reaches a plan that leans less."""
    g, n = sum(plans[0]), len(plans[0])
    return list(max(plans, key=lambda p: sum((b - g / n) ** 2 for b in p)))


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of one figure over rounds."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(rounds: list[dict], trainings: Sequence[str], config: dict, description: list[dict],
              emulation: str) -> dict[str, Any]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    n = len(description)
    result: dict[str, Any] = {
        "benchmark": "balance", "emulation": emulation, "cluster": description, "config": config,
        "trainings": list(trainings), "global_batch": config["batch_per_rank"] * n,
        "solo_samples_per_s": [statistics.median(r["solo_samples_per_s"][k] for r in rounds) for k in range(n)],
        "t_ar_s": med("t_ar_s"), "ideal_samples_per_s": med("ideal_samples_per_s"), "spread": {},
    }
    for m in trainings:
        key = f"{m}_samples_per_s"
        result[key] = med(key)
        result["spread"][key] = spread([r[key] for r in rounds])
        result[f"{m}_vs_ideal"] = med(f"{m}_vs_ideal")
        result[f"balance_{m}"] = med(f"balance_{m}")
        result[f"fast_rank_idle_fraction_{m}"] = med(f"fast_rank_idle_fraction_{m}")
        if m != "ddp" and "ddp" in trainings:
            result[f"{m}_speedup_vs_ddp"] = med(f"{m}_speedup_vs_ddp")
    for m, suffix in _SUFFIX.items():  # the legacy keys
        if m in trainings:
            result[f"throughput_vs_ideal{suffix}"] = result[f"{m}_vs_ideal"]
            result[f"balance_hetero{suffix}"] = result[f"balance_{m}"]
            result[f"fast_rank_idle_fraction_hetero{suffix}"] = result[f"fast_rank_idle_fraction_{m}"]
            if "ddp" in trainings:
                result[f"speedup_vs_ddp{suffix}"] = result[f"{m}_speedup_vs_ddp"]
    if "hetero_tiered" in trainings and "ddp_powersgd" in trainings:  # paired within a round
        result["hetero_tiered_vs_ddp_powersgd"] = statistics.median(
            r["hetero_tiered_samples_per_s"] / r["ddp_powersgd_samples_per_s"] for r in rounds)
    result["gap"] = {m: {k: statistics.median(r["modes"][m]["gap"][k] for r in rounds) for k in rounds[0]["modes"][m]["gap"]}
                     for m in trainings if all("gap" in r["modes"][m] for r in rounds)}  # medians over rounds
    result["fast_rank_idle_fraction_solo_estimate"] = {
        m: med(f"fast_rank_idle_fraction_{m}_solo_estimate") for m in trainings}
    result["batch_sizes"] = {m: rounds[-1]["modes"][m]["batch_sizes"] for m in trainings}
    if "hetero_cal" in trainings:
        result["calibration_decisions"] = rounds[-1]["modes"]["hetero_cal"].get("decisions")
    if rounds[0].get("sweep"):
        _add_sweep(result, rounds, trainings)
    result["rounds"] = rounds
    result["goals"] = goals(result)
    return result


def _add_sweep(result: dict[str, Any], rounds: list[dict], trainings: Sequence[str]) -> None:
    sweep = []
    for j, point in enumerate(rounds[0]["sweep"]):
        entry = {"sizes": point["sizes"], **spread([r["sweep"][j]["samples_per_s"] for r in rounds])}
        sweep.append(entry)
    j = max(range(len(sweep)), key=lambda i: sweep[i]["median"])
    result["sweep"] = sweep
    result["best_split"] = sweep[j]["sizes"]
    result["best_split_samples_per_s"] = sweep[j]["median"]
    # an end of a sweep of 3+ splits (in increasing alpha) may not bracket the best split
    result["best_split_at_sweep_edge"] = len(sweep) >= 3 and j in (0, len(sweep) - 1)
    for m in trainings:  # paired within a round's cycle: the training's split against the best one
        if f"{m}_split_samples_per_s" in rounds[0]:
            result[f"{m}_split_samples_per_s"] = statistics.median(r[f"{m}_split_samples_per_s"] for r in rounds)
            result[f"{m}_vs_best_split"] = statistics.median(
                r[f"{m}_split_samples_per_s"] / r["sweep"][j]["samples_per_s"] for r in rounds)


def goals(result: dict) -> dict[str, dict]:
    """Each goal that applies to the trainings run: {key: {goal, value, met}} (idle: at most)."""
    wanted: dict[str, float] = {}
    trainings = result.get("trainings", ("ddp", "hetero", "hetero_cal"))
    for m, suffix in _SUFFIX.items():
        if m in trainings:
            wanted[f"throughput_vs_ideal{suffix}"] = 0.95
            wanted[f"fast_rank_idle_fraction_hetero{suffix}"] = 0.05
            if "ddp" in trainings:
                wanted[f"speedup_vs_ddp{suffix}"] = 1.3
            if "best_split" in result:
                wanted[f"{m}_vs_best_split"] = 0.97
    if "hetero_tiered" in trainings and "ddp" in trainings:
        wanted["hetero_tiered_speedup_vs_ddp"] = 2.0
    if "hetero_tiered_vs_ddp_powersgd" in result:
        wanted["hetero_tiered_vs_ddp_powersgd"] = 1.0
    out = {}
    for k, v in wanted.items():
        value = result[k]
        out[k] = {"goal": v, "value": value, "met": value <= v if "idle" in k else value >= v}
    if "best_split" in result:  # a best split at an end of the sweep may not be the best there is
        out["sweep_brackets_best_split"] = {"goal": True, "value": not result["best_split_at_sweep_edge"],
                                            "met": not result["best_split_at_sweep_edge"]}
    return out
