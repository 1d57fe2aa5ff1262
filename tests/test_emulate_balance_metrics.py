"""Figures of ``bench balance`` from hand-built per-rank clocks (definitions in runtime/metrics.py)."""

from __future__ import annotations

import pytest
from hetero_bench.balance_metrics import mode_figures, round_figures, solo_figures


def _clock(step_s: float, steps: int) -> list[float]:
    return [i * step_s for i in range(steps + 1)]


def test_solo_speeds_and_ideal():
    ranks = [{"starts": _clock(0.25, 10), "ar_times": [0.1, 0.1, 0.3], "grad_bytes": 8},
             {"starts": _clock(0.5, 10), "ar_times": [0.1, 0.2, 0.2], "grad_bytes": 8}]
    solo = solo_figures(ranks, batch=100)
    assert solo["solo_samples_per_s"] == pytest.approx([400.0, 200.0])
    assert solo["t_ar_s"] == pytest.approx(0.2)  # the slower rank's median
    out = round_figures(solo, {}, global_batch=200)
    # G / (G / sum r + t_ar) = 200 / (200 / 600 + 0.2)
    assert out["ideal_samples_per_s"] == pytest.approx(200 / (1 / 3 + 0.2))


def test_ddp_idle_balance_and_speedup():
    solo = {"solo_samples_per_s": [400.0, 200.0], "t_ar_s": 0.1}
    # DDP: both ranks step at the slow rank's pace, 100/200 + 0.1 = 0.6 s.
    ddp = [{"starts": _clock(0.6, 20), "batches": [100] * 20} for _ in range(2)]
    # hetero: 133/67 split, measured compute times given by the strategy's clock.
    het = [{"starts": _clock(0.45, 20), "batches": [b] * 20, "compute_s": [c] * 20}
           for b, c in ((133, 0.33), (67, 0.34))]
    modes = {"ddp": mode_figures(ddp, solo, measure=10), "hetero": mode_figures(het, solo, measure=10)}
    assert modes["ddp"]["samples_per_s"] == pytest.approx(200 / 0.6)
    # fast rank (solo estimate 100/400 = 0.25 s of compute): 0.6 - 0.25 = 0.35 s not computing in a 0.6 s step
    assert modes["ddp"]["fast_rank_idle_fraction"] == pytest.approx(0.35 / 0.6)
    assert modes["ddp"]["balance"] == pytest.approx(1 - (0.5 - 0.25) / 0.5)  # from solo speeds
    # hetero: the measured compute of the fast rank (0.33 s) counts, not the solo estimate.
    assert modes["hetero"]["fast_rank_idle_fraction"] == pytest.approx((0.45 - 0.33) / 0.45)
    assert modes["hetero"]["fast_rank_idle_fraction_solo_estimate"] == pytest.approx(
        (0.45 - 133 / 400) / 0.45)
    assert modes["hetero"]["balance"] == pytest.approx(1 - 0.01 / 0.34)
    assert modes["hetero"]["batch_sizes"] == [133, 67]
    out = round_figures(solo, modes, global_batch=200)
    assert out["hetero_speedup_vs_ddp"] == pytest.approx(0.6 / 0.45)
    assert out["hetero_vs_ideal"] == pytest.approx((200 / 0.45) / out["ideal_samples_per_s"])


def test_idle_never_negative_when_the_estimated_compute_outlasts_the_step():
    solo = {"solo_samples_per_s": [400.0, 200.0], "t_ar_s": 0.2}
    # the fast rank's estimated compute, 133 / 400 = 0.3325 s, is longer than the 0.3 s step
    het = [{"starts": _clock(0.3, 12), "batches": [b] * 12} for b in (133, 67)]
    assert mode_figures(het, solo, measure=5)["fast_rank_idle_fraction"] == 0.0


def test_the_gap_to_ideal_splits_into_parts_worked_out_by_hand():
    """Solo 100 and 50 samples/s, t_ar 0.1 s; 80/40 samples computed in 0.9 / 0.85 s, a 1.1 s step.
    A perfect split at solo speeds computes in 120 / 150 = 0.8 s; the run computes 1.125x and 1.0625x
    slower than alone (mean 1.09375): 0.075 s of slowdown; the slowest rank 0.9 - 0.875 = 0.025 s over
    a perfect split at those speeds; after backward 1.1 - 0.9 - 0.1 = 0.1 s beyond the all-reduce."""
    from hetero_bench.balance_metrics import gap_shares

    got = gap_shares(1.1, [80, 40], [0.9, 0.85], {"solo_samples_per_s": [100.0, 50.0], "t_ar_s": 0.1})
    want = {"ideal": 0.9, "slowdown": 0.075, "imbalance": 0.025, "after_backward": 0.1}
    assert got == pytest.approx({k: v / 1.1 for k, v in want.items()})
    assert sum(got.values()) == pytest.approx(1.0)
