"""The accelerate-overhead benchmark's summary, on hand-built rounds (the benchmark itself is not a test)."""

from __future__ import annotations

import pytest
from hetero_bench.accelerate import _summary


def test_summary_is_per_round_ratios_with_median_and_spread():
    rounds = [
        {"plain_step_s": 0.10, "hetero_step_s": 0.11},   # 1.10
        {"plain_step_s": 0.20, "hetero_step_s": 0.19},   # 0.95
        {"plain_step_s": 0.10, "hetero_step_s": 0.102},  # 1.02
    ]
    s = _summary(rounds, batch=16)  # G = 32 samples per step
    assert s["step_time_ratio_median"] == pytest.approx(1.02)
    assert (s["step_time_ratio_min"], s["step_time_ratio_max"]) == pytest.approx((0.95, 1.10))
    assert s["overhead_median"] == pytest.approx(0.02)
    assert s["plain_samples_per_s_median"] == pytest.approx(320.0)  # median of 320, 160, 320
    assert s["hetero_samples_per_s_median"] == pytest.approx(32 / 0.11)  # median of 290.9, 168.4, 313.7
