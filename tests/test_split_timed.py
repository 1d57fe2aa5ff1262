"""Step-time-equalising split and the two-point step-cost fit, against hand-built and brute-force oracles."""

from __future__ import annotations

import itertools
import random

import pytest

from hetero_strategy.balance import split_batch, split_batch_timed
from hetero_strategy.balance.probe import StepCost, fit_step_cost


def _slowest(sizes, rates, fixed):
    return max(f + b / r for b, r, f in zip(sizes, rates, fixed))


def test_hand_built_case():
    # rates 2 and 1 sample/s, fixed 0 and 1 s: 2T + (T - 1) = 12 -> T = 13/3 -> [8.67, 3.33].
    assert split_batch_timed(12, [2.0, 1.0], [0.0, 1.0]) == [9, 3]
    # Proportional split ignores the fixed second and gives the slow rank one more.
    assert split_batch(12, [2.0, 1.0]) == [8, 4]


def test_no_fixed_cost_is_the_proportional_split():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 6)
        rates = [rng.uniform(0.1, 10.0) for _ in range(n)]
        g = rng.randint(n, 500)
        assert split_batch_timed(g, rates, [0.0] * n) == split_batch(g, rates)


def test_matches_brute_force_optimum_within_one_sample():
    # Oracle: the split of G over 3 ranks with the smallest slowest-rank step, by enumeration.
    rng = random.Random(1)
    for _ in range(60):
        rates = [rng.uniform(50, 600) for _ in range(3)]
        fixed = [rng.uniform(0.0, 0.1) for _ in range(3)]
        g = rng.randint(3, 90)
        best = min(_slowest((a, b, g - a - b), rates, fixed)
                   for a, b in itertools.product(range(1, g), repeat=2) if g - a - b >= 1)
        sizes = split_batch_timed(g, rates, fixed)
        assert sum(sizes) == g and min(sizes) >= 1
        # Rounding may cost at most one sample on the slowest rank.
        assert _slowest(sizes, rates, fixed) <= best + 1.0 / min(rates) + 1e-12


def test_caps_and_floor_hold():
    sizes = split_batch_timed(100, [10.0, 1.0, 1.0], [0.0, 5.0, 5.0], max_per_rank=[60, 60, 60])
    assert sizes[0] == 60 and sum(sizes) == 100
    # A rank whose fixed cost exceeds the others' whole step still gets its one sample.
    assert split_batch_timed(10, [1.0, 1.0], [0.0, 100.0]) == [9, 1]


@pytest.mark.parametrize("rates, fixed", [([1.0, 0.0], [0.0, 0.0]), ([1.0, 1.0], [0.0, -0.1]), ([1.0], [0.0, 0.0])])
def test_bad_costs_are_refused(rates, fixed):
    with pytest.raises(ValueError, match="samples_per_s"):
        split_batch_timed(8, rates, fixed)


def test_fit_step_cost_two_points():
    cost = fit_step_cost([(128, 0.3), (64, 0.2)])
    assert cost.samples_per_s == pytest.approx(640.0) and cost.fixed_s == pytest.approx(0.1)
    assert cost.seconds(96) == pytest.approx(0.25)


def test_fit_step_cost_falls_back_to_plain_rate_on_noise():
    # The smaller batch took longer (noise): the larger batch's plain rate is used.
    assert fit_step_cost([(128, 0.3), (64, 0.31)]) == StepCost(128 / 0.3)
    # A line that would cross below zero (negative fixed cost) also falls back.
    assert fit_step_cost([(128, 0.3), (64, 0.01)]) == StepCost(128 / 0.3)


def test_a_probed_split_leaves_every_rank_two_samples_where_the_batch_allows(monkeypatch):
    """A slow rank whose probe says 1 sample ([63, 1]) trains on 2 through the runtime's planner: a
    BatchNorm over a 1x1 map raises on one sample. Where G < 2W, one sample per rank is the floor."""
    from hetero_strategy.balance import least_share
    from hetero_strategy.config import BalanceConfig
    from hetero_strategy.runtime import planner

    costs = [StepCost(400.0, 0.0), StepCost(100.0, 0.15)]
    assert split_batch_timed(64, [c.samples_per_s for c in costs], [c.fixed_s for c in costs]) == [63, 1]
    assert least_share(64, 2) == 2 and least_share(5, 3) == 1
    # every rank's probed cost, as the all-gather would return it on a 2-rank job
    monkeypatch.setattr(planner, "gather_step_costs", lambda cost, world, info=None, warn=None: costs)
    assert planner.plan_batch_sizes(BalanceConfig(), 2, 64, lambda: costs[0]) == [62, 2]
