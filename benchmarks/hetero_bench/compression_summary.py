"""What ``bench compression`` reports: per-method figures, ratios of medians, the goals, the chart.

Every time figure is a median over seeds with its spread ([min, max]) beside it; a ratio is of two
medians from the same run (the methods alternate within each seed's round). ``ddp_powersgd_best``
is the PowerSGD rank (1, 2, 4, 8) with the least median time to target in this run. The old
method names (``dense_fp32``, ``fp16``, ``powersgd``) are kept as aliases of ``ddp``,
``ddp_fp16`` and ``ddp_powersgd`` while docs and scripts read them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

__all__ = ["chart", "goals", "ratios", "retarget", "summarise"]

OURS = ("topk", "topk_allreduce", "tiered", "auto")
_POWERSGD = {"ddp_powersgd_r1": 1, "ddp_powersgd_r2": 2, "ddp_powersgd": 4, "ddp_powersgd_r8": 8}
_OLD = {"dense_fp32": "ddp", "fp16": "ddp_fp16", "powersgd": "ddp_powersgd"}


def _spread(xs: list[float]) -> list[float] | None:
    return [min(xs), max(xs)] if xs else None


def _median(xs: list) -> float | None:
    return None if not xs or None in xs else statistics.median(xs)


def summarise(conv: dict, slow: dict | None, fast: dict | None) -> dict:
    """Per method: the time-to-accuracy figures (every method) and the step-time ones (when run)."""
    methods = {}
    for m, runs in conv.items():
        if m.startswith("_"):
            continue
        reached = [r["time_to_target_s"] for r in runs]
        out = {
            "world_size": runs[0]["world_size"],
            "batch_sizes": runs[0]["batch_sizes"],
            "time_to_target_s": _median(reached),
            "time_to_target_spread_s": None if None in reached else _spread(reached),
            "time_to_target_per_seed_s": reached,
            "accuracy": statistics.mean(r["accuracy"] for r in runs),
            "accuracy_per_seed": [r["accuracy"] for r in runs],
            "steps_to_target": _median([r["steps_to_target"] for r in runs]),
            "steps_to_target_per_seed": [r["steps_to_target"] for r in runs],
            "wire_bytes_per_step": statistics.median(r["wire_bytes_per_step"] for r in runs),
            "hook_bytes_per_step": statistics.median(r["hook_bytes_per_step"] for r in runs),
            "e2e_step_time_s": statistics.median(r["step_time_s"] for r in runs),
            "e2e_dense_steps_per_seed": [r["dense_steps"] for r in runs],
            "decision_per_seed": [r["decision"] for r in runs] if runs[0].get("decision") else None,
            "curve_per_seed": [r["curve"] for r in runs],  # (step, held-out accuracy, training seconds)
        }
        if slow and m in slow:
            t, f = slow[m], (fast or {}).get(m)
            out.update(step_time_s=statistics.median(t["step_s"]), step_time_spread_s=_spread(t["step_s"]),
                       bytes_per_step=statistics.median(t["bytes"]),
                       steptime_wire_bytes_per_step=statistics.median(t["wire_bytes"]),
                       density=statistics.mean(t["density"]),
                       dense_fallback=statistics.mean(t.get("dense_fallback", [0.0])))
            if f:
                out.update(unthrottled_step_time_s=statistics.median(f["step_s"]),
                           unthrottled_step_time_spread_s=_spread(f["step_s"]))
        methods[m] = out
    ranks = {m: r for m, r in _POWERSGD.items() if m in methods}
    timed = {m: methods[m]["time_to_target_s"] for m in ranks if methods[m]["time_to_target_s"] is not None}
    if timed:
        best = min(timed, key=timed.get)
        methods["ddp_powersgd_best"] = {**methods[best], "rank": ranks[best], "method": best}
    for old, new in _OLD.items():
        if new in methods:
            methods[old] = methods[new]
    return methods


def retarget(methods: dict, target: float) -> dict:
    """The same run's methods at another target accuracy, read off each seed's held-out curve
    (the clock at the first evaluation at or above ``target``); step-time figures are kept."""
    conv: dict[str, list[dict]] = {}
    for m, v in methods.items():
        if m in _OLD or m == "ddp_powersgd_best":
            continue
        runs = []
        for seed, curve in enumerate(v["curve_per_seed"]):
            hit = next(((step, t) for step, acc, t in curve if acc >= target), (None, None))
            runs.append({"time_to_target_s": hit[1], "steps_to_target": hit[0], "accuracy": v["accuracy_per_seed"][seed],
                         "world_size": v["world_size"], "batch_sizes": v["batch_sizes"],
                         "wire_bytes_per_step": v["wire_bytes_per_step"], "hook_bytes_per_step": v["hook_bytes_per_step"],
                         "step_time_s": v["e2e_step_time_s"], "dense_steps": v["e2e_dense_steps_per_seed"][seed],
                         "decision": (v["decision_per_seed"] or [None] * len(v["curve_per_seed"]))[seed], "curve": curve})
        conv[m] = runs
    out = summarise(conv, None, None)
    for m, v in out.items():  # the step-time job's figures are not in the curves: keep them
        v.update({k: x for k, x in methods.get(m, {}).items() if k not in v})
    return out


def _ratio(methods: dict, a: str, b: str) -> float | None:
    ta = methods.get(a, {}).get("time_to_target_s")
    tb = methods.get(b, {}).get("time_to_target_s")
    return ta / tb if ta is not None and tb else None


def ratios(methods: dict) -> dict:
    """Times to target of our methods over the baselines' (ratios of medians), accuracy deltas."""
    out: dict[str, float | None] = {}
    for name in OURS:
        if name not in methods:
            continue
        for base in ("ddp", "ddp_fp16", "ddp_powersgd", "ddp_powersgd_best", *_OLD):
            if base in methods:
                out[f"{name}_time_to_target_vs_{base}"] = _ratio(methods, name, base)
        out[f"{name}_accuracy_minus_dense_points"] = 100 * (methods[name]["accuracy"] - methods["ddp"]["accuracy"])
    ours = {m: methods[m]["time_to_target_s"] for m in ("topk_allreduce", "tiered", "auto")
            if methods.get(m, {}).get("time_to_target_s") is not None}
    if ours:
        best = min(ours, key=ours.get)
        out["best_of_ours"] = best  # type: ignore[assignment]
        out["best_of_ours_time_to_target_vs_ddp_powersgd"] = _ratio(methods, best, "ddp_powersgd")
        out["best_of_ours_accuracy_minus_dense_points"] = 100 * (methods[best]["accuracy"] - methods["ddp"]["accuracy"])
    fixed = {m: v["time_to_target_s"] for m, v in methods.items()
             if m not in ("auto", "ddp_powersgd_best", *_OLD) and v["time_to_target_s"] is not None}
    if "auto" in methods and fixed:
        best_fixed = min(fixed, key=fixed.get)
        out["best_fixed"] = best_fixed  # type: ignore[assignment]
        out["auto_time_to_target_vs_best_fixed"] = _ratio(methods, "auto", best_fixed)
    return out


def goals(methods: dict, r: dict, ranks: int, unthrottled: bool) -> dict:
    """The issue's targets for this configuration, each with its figure and whether it holds."""
    def check(value: float | None, limit: float) -> dict:
        return {"value": value, "limit": limit, "met": value is not None and value <= limit}

    out = {}
    if "auto" in methods:
        out["auto_within_10pct_of_best_fixed"] = check(r.get("auto_time_to_target_vs_best_fixed"), 1.10)
    if ranks == 2 and not unthrottled:
        out["best_of_ours_vs_ddp_powersgd"] = check(r.get("best_of_ours_time_to_target_vs_ddp_powersgd"), 0.8)
        acc = r.get("best_of_ours_accuracy_minus_dense_points")
        out["best_of_ours_accuracy_within_half_point"] = {"value": acc, "limit": -0.5,
                                                          "met": acc is not None and acc >= -0.5}
    if ranks == 4:
        out["auto_vs_ddp_powersgd"] = check(r.get("auto_time_to_target_vs_ddp_powersgd"), 0.75)
        out["auto_vs_ddp"] = check(r.get("auto_time_to_target_vs_ddp"), 0.4)
    return out


def chart(methods: dict, path: Path, title: str) -> None:
    """Time to target (median, min-max bars) and wire bytes per step, per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m for m in methods if m not in _OLD]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.2))
    med = [methods[n]["time_to_target_s"] or 0.0 for n in names]
    lo = [m - (methods[n]["time_to_target_spread_s"] or [m, m])[0] for m, n in zip(med, names)]
    hi = [(methods[n]["time_to_target_spread_s"] or [m, m])[1] - m for m, n in zip(med, names)]
    colors = ["#2a6" if n in OURS else "#777" for n in names]
    ax.bar(names, med, yerr=[lo, hi], capsize=3, color=colors)
    for i, n in enumerate(names):
        ax.text(i, med[i], f"{100 * methods[n]['accuracy']:.1f}%", ha="center", va="bottom", fontsize=7)
    ax.set_title("time to target accuracy (s; median, min-max over seeds; final accuracy)", fontsize=9)
    bx.bar(names, [methods[n]["wire_bytes_per_step"] / 1e3 for n in names], color=colors)
    bx.set_yscale("log")
    bx.set_title("kB per rank per step on the wire (log)", fontsize=9)
    for a in (ax, bx):
        a.tick_params(axis="x", rotation=40, labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
