"""``bench balance``'s summary and goals from hand-built rounds (the benchmark itself is not a test)."""

from __future__ import annotations

import statistics

import pytest
from hetero_bench.balance_metrics import round_figures
from hetero_bench.balance_summary import summarise, sweep_anchor, sweep_splits

_SOLO = {"solo_samples_per_s": [400.0, 200.0], "t_ar_s": 0.1}


def _mode(sps: float, sizes: list[int]) -> dict:
    return {"samples_per_s": sps, "batch_sizes": sizes, "fast_rank_idle_fraction": 0.01,
            "fast_rank_idle_fraction_solo_estimate": 0.02, "balance": 0.95}


def _rounds(per_mode: dict[str, list[float]], sweep: dict[tuple, list[float]] | None = None,
            in_cycle: dict[str, list[float]] | None = None) -> list[dict]:
    """Rounds as the benchmark builds them; with a sweep, each training's split as its round's cycle
    measured it (``in_cycle``; by default the training's own figure)."""
    rounds = []
    for i in range(len(next(iter(per_mode.values())))):
        modes = {m: _mode(v[i], [128, 128] if m.startswith("ddp") else [170, 86]) for m, v in per_mode.items()}
        r = round_figures(_SOLO, modes, 256)
        if sweep:
            r["sweep"] = [{"sizes": list(s), "samples_per_s": v[i]} for s, v in sweep.items()]
            for m, v in (in_cycle or {m: v for m, v in per_mode.items() if m in ("ddp", "hetero", "hetero_cal")}).items():
                r[f"{m}_split_samples_per_s"] = v[i]
        rounds.append(r)
    return rounds


def _config() -> dict:
    return {"batch_per_rank": 128, "compute": "1.0,0.5", "link": "10gbit"}


def test_sweep_splits_lie_on_the_line_through_the_plan():
    # equal split 128/128, plan 189/67: a = 0.8 -> 176.8/79.2, a = 1.2 -> 201.2/54.8
    assert sweep_splits([189, 67], [0.8, 1.0, 1.2]) == [[177, 79], [189, 67], [201, 55]]
    assert sweep_splits([189, 67], [0.0]) == [[128, 128]]
    assert sweep_splits([10, 10, 10], [0.5, 1.0, 1.5]) == [[10, 10, 10]]  # a balanced plan: one split
    four = sweep_splits([100, 60, 50, 46], [1.2])
    assert sum(four[0]) == 256 and min(four[0]) >= 1


def test_sweep_anchor_is_the_plan_leaning_furthest_from_equal():
    # round 0 of the 1.0 / 0.57 cluster: the static probe [76, 52], the calibrated run [93, 35]
    assert sweep_anchor([[76, 52], [93, 35]]) == [93, 35]
    assert sweep_anchor([[30, 98], [70, 58]]) == [30, 98]  # leaning the other way counts as far
    assert sweep_anchor([[64, 64]]) == [64, 64]
    # the default points about [93, 35] bracket the best split measured then (about [97, 31])
    fast = [s[0] for s in sweep_splits(sweep_anchor([[76, 52], [93, 35]]), [0.5, 0.75, 1.0, 1.25, 1.5, 1.8])]
    assert fast[0] < 97 < fast[-1] and fast == sorted(fast)


def test_medians_spread_best_split_and_goals():
    per_mode = {"ddp": [100.0, 98.0, 104.0, 101.0, 99.0],
                "hetero": [130.0, 128.0, 140.0, 90.0, 131.0],  # one disturbed round
                "hetero_cal": [133.0, 131.0, 134.0, 129.0, 120.0]}
    sweep = {(160, 96): [120.0, 121.0, 119.0, 122.0, 118.0],
             (170, 86): [134.0, 133.0, 135.0, 132.0, 90.0],
             (180, 76): [128.0, 140.0, 127.0, 126.0, 129.0]}  # one lucky round does not make it best
    result = summarise(_rounds(per_mode, sweep), ["ddp", "hetero", "hetero_cal"], _config(), [{}, {}], "namespaces")
    assert result["hetero_samples_per_s"] == 130.0
    assert result["spread"]["hetero_samples_per_s"] == {"median": 130.0, "min": 90.0, "max": 140.0}
    assert result["best_split"] == [170, 86] and result["best_split_samples_per_s"] == 133.0
    assert result["best_split_at_sweep_edge"] is False
    # per round against the best split's own round (paired), then the median
    assert result["hetero_vs_best_split"] == pytest.approx(statistics.median(
        h / b for h, b in zip(per_mode["hetero"], sweep[(170, 86)])))
    # legacy keys, as scripts read them (median of the per-round ratios)
    assert result["speedup_vs_ddp"] == pytest.approx(statistics.median(
        h / d for h, d in zip(per_mode["hetero"], per_mode["ddp"])))
    assert result["speedup_vs_ddp_calibrated"] == pytest.approx(statistics.median(
        c / d for c, d in zip(per_mode["hetero_cal"], per_mode["ddp"])))
    ideal = 256 / (256 / 600 + 0.1)  # G / (G / sum r + t_ar), the same every round here
    assert result["throughput_vs_ideal"] == pytest.approx(130 / ideal)
    goals = result["goals"]
    assert goals["hetero_vs_best_split"]["met"] is True  # 0.97
    assert goals["hetero_cal_vs_best_split"]["met"] is True
    assert goals["speedup_vs_ddp"]["met"] is True
    assert goals["fast_rank_idle_fraction_hetero"]["met"] is True  # 0.01 <= 0.05
    assert "hetero_tiered_speedup_vs_ddp" not in goals


def test_a_plan_short_of_the_best_split_misses_its_goal_and_an_edge_best_is_flagged():
    per_mode = {"ddp": [100.0] * 5, "hetero": [125.0] * 5}
    sweep = {(160, 96): [120.0] * 5, (170, 86): [126.0] * 5, (180, 76): [135.0] * 5}
    result = summarise(_rounds(per_mode, sweep), ["ddp", "hetero"], _config(), [{}, {}], "namespaces")
    assert result["goals"]["hetero_vs_best_split"]["met"] is False  # 125 / 135 = 0.926
    assert result["best_split_at_sweep_edge"] is True
    assert "speedup_vs_ddp_calibrated" not in result and "hetero_cal_vs_best_split" not in result["goals"]


def test_a_trainings_split_is_judged_by_its_cycle_figure_not_its_own_runs():
    # the static run measured 125/s in its own launch, but its split measured 134/s in the cycle
    # where the best split measured 135/s: 0.993, met; the cycle's DDP arm is kept too
    per_mode = {"ddp": [100.0] * 5, "hetero": [125.0] * 5}
    sweep = {(160, 96): [120.0] * 5, (170, 86): [135.0] * 5, (180, 76): [130.0] * 5}
    in_cycle = {"ddp": [90.0, 91.0, 92.0, 93.0, 94.0], "hetero": [134.0, 130.0, 136.0, 133.0, 135.0]}
    result = summarise(_rounds(per_mode, sweep, in_cycle), ["ddp", "hetero"], _config(), [{}, {}], "namespaces")
    assert result["hetero_vs_best_split"] == pytest.approx(134 / 135)
    assert result["goals"]["hetero_vs_best_split"]["met"] is True
    assert result["hetero_split_samples_per_s"] == 134.0 and result["hetero_samples_per_s"] == 125.0
    assert result["ddp_vs_best_split"] == pytest.approx(92 / 135)
    assert result["best_split_at_sweep_edge"] is False


def test_mixed_link_trainings_have_their_own_goals():
    per_mode = {"ddp": [50.0, 52.0, 49.0], "ddp_powersgd": [90.0, 95.0, 85.0], "hetero_tiered": [120.0, 118.0, 80.0]}
    result = summarise(_rounds(per_mode), list(per_mode), _config(), [{}, {}], "namespaces")
    goals = result["goals"]
    assert set(goals) == {"hetero_tiered_speedup_vs_ddp", "hetero_tiered_vs_ddp_powersgd"}
    assert goals["hetero_tiered_speedup_vs_ddp"]["value"] == pytest.approx(statistics.median([2.4, 118 / 52, 80 / 49]))
    assert goals["hetero_tiered_vs_ddp_powersgd"]["value"] == pytest.approx(statistics.median(
        [120 / 90, 118 / 95, 80 / 85]))
    assert goals["hetero_tiered_vs_ddp_powersgd"]["met"] is True
    assert "best_split" not in result


# The keys scripts read from benchmarks/results/balance.json (issue 3's names): they must not move.
_LEGACY_KEYS = {
    "benchmark", "emulation", "cluster", "config", "global_batch", "solo_samples_per_s", "t_ar_s",
    "ideal_samples_per_s", "ddp_samples_per_s", "hetero_samples_per_s", "hetero_cal_samples_per_s",
    "throughput_vs_ideal", "throughput_vs_ideal_calibrated", "ddp_vs_ideal", "speedup_vs_ddp",
    "speedup_vs_ddp_calibrated", "fast_rank_idle_fraction_ddp", "fast_rank_idle_fraction_hetero",
    "fast_rank_idle_fraction_hetero_calibrated", "fast_rank_idle_fraction_solo_estimate", "balance_ddp",
    "balance_hetero", "balance_hetero_calibrated", "batch_sizes", "calibration_decisions", "rounds", "goals",
}


def test_the_default_trainings_keep_every_key_scripts_read():
    per_mode = {"ddp": [100.0] * 3, "hetero": [130.0] * 3, "hetero_cal": [131.0] * 3}
    result = summarise(_rounds(per_mode), ["ddp", "hetero", "hetero_cal"], _config(), [{}, {}], "namespaces")
    assert _LEGACY_KEYS <= set(result)
    assert {"throughput_vs_ideal", "speedup_vs_ddp", "fast_rank_idle_fraction_hetero"} <= set(result["goals"])


@pytest.mark.parametrize(("argv", "needle"), [
    (["--trainings", "ddp,ddp_powersgd"], "needs --framework ddp"),  # Lightning: no comm hook on CPU
    (["--trainings", "ddp,warp"], "--trainings='ddp,warp' is invalid"),
    (["--sweep", "--trainings", "ddp,hetero_cal"], "include hetero"),
    (["--sweep", "--sweep-points", "0.9,nan"], "--sweep-points='0.9,nan' is invalid"),
])
def test_bad_bench_options_are_refused_before_anything_starts(argv, needle):
    import argparse

    from hetero_bench.balance import _check, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    message = _check(parser.parse_args(argv))
    assert isinstance(message, str) and needle in message
    assert not isinstance(_check(parser.parse_args(["--framework", "ddp", "--trainings", "ddp,ddp_powersgd"])), str)
