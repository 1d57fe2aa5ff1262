"""The length-skewed text task and ``bench lengths``' figures (the benchmark itself is not a test)."""

from __future__ import annotations

import statistics

import pytest
import torch
from hetero_bench.lengths import figures

from hetero_strategy.balance.costed import deal_by_cost
from hetero_strategy.workloads.skewed_text import PackedTokenMLP, SkewedTexts, pack


def test_lengths_are_skewed_and_labels_follow_the_rule():
    data = SkewedTexts(2000, seed=3)
    long = [n for n in data.lengths if n >= 160]
    assert 0.12 < len(long) / len(data) < 0.18  # long_fraction 0.15
    assert all(8 <= n <= 32 or 160 <= n <= 320 for n in data.lengths)
    tokens, label = data[5]
    assert len(tokens) == data.lengths[5] and label == int((tokens < 256).float().mean() > 0.5)


def test_packed_forward_equals_one_sequence_at_a_time():
    data = SkewedTexts(6, seed=1)
    net = PackedTokenMLP()
    tokens, segments, labels = pack([data[i] for i in range(6)])
    assert tokens.shape == (sum(data.lengths[:6]),) and labels.tolist() == data.labels[:6]
    packed = net(tokens, segments, 6)
    alone = torch.cat([net(t, torch.zeros(len(t), dtype=torch.long), 1) for t, _ in (data[i] for i in range(6))])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-6)


def test_dealing_by_tokens_evens_the_per_step_load_a_count_split_leaves_uneven():
    # 64-sample global batches split 40/24 (shares of a 1.0 / 0.6 pair): per step, predicted time
    # load_r / share_r of each rank; the cost deal keeps the slower rank's lag small.
    data = SkewedTexts(64 * 20, seed=2)
    count_lag, cost_lag = [], []
    for step in range(20):
        costs = data.lengths[64 * step:64 * (step + 1)]
        by_count = [costs[:40], costs[40:]]
        dealt = deal_by_cost(costs, [40, 24])
        by_cost = [[costs[i] for i in part] for part in dealt]
        for parts, lags in ((by_count, count_lag), (by_cost, cost_lag)):
            t = [sum(p) / s for p, s in zip(parts, (40, 24))]
            lags.append(max(t) / min(t))
    assert statistics.median(cost_lag) < 1.05 < statistics.median(count_lag)


def test_figures_from_hand_built_clocks():
    # two ranks, 0.5 s steps; tokens 300 + 100 per step; compute 0.4 / 0.2 s -> balance 0.5
    ranks = [{"starts": [0.5 * i for i in range(11)], "batches": [300] * 10, "compute_s": [0.4] * 10},
             {"starts": [0.5 * i for i in range(11)], "batches": [100] * 10, "compute_s": [0.2] * 10}]
    f = figures(ranks, measure=5, global_batch=64)
    assert f["step_s"] == pytest.approx(0.5)
    assert f["samples_per_s"] == pytest.approx(128.0)
    assert f["tokens_per_s"] == pytest.approx(800.0)
    assert f["balance"] == pytest.approx(0.5)
