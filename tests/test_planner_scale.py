"""The planner and the sampler at 8 ranks with mocked timings, against hand-built oracles.

The oracle for the timed split is the greedy one: start every rank at one sample, then give
each further sample to the rank that would finish it soonest. For step costs
``fixed_r + b_r / rate_r`` (increasing in b_r) this greedy minimises the slowest rank's time.
"""

from __future__ import annotations

import random

import pytest

from hetero_strategy.balance import HeteroBatchSampler, split_batch, split_batch_timed

WORLD = 8


def _greedy(global_batch: int, rates: list[float], fixed: list[float], caps: list[int]) -> list[int]:
    sizes = [1] * len(rates)
    for _ in range(global_batch - len(rates)):
        r = min((r for r in range(len(rates)) if sizes[r] < caps[r]),
                key=lambda r: fixed[r] + (sizes[r] + 1) / rates[r])
        sizes[r] += 1
    return sizes


def _makespan(sizes: list[int], rates: list[float], fixed: list[float]) -> float:
    return max(f + b / r for b, r, f in zip(sizes, rates, fixed))


def _cluster(rng: random.Random) -> tuple[int, list[float], list[float], list[int]]:
    """A mixed 8-rank cluster: speeds 1-20x apart, fixed costs, and memory caps that bind sometimes."""
    rates = [rng.choice([40.0, 90.0, 300.0, 800.0]) * rng.uniform(0.8, 1.2) for _ in range(WORLD)]
    fixed = [rng.choice([0.0, 0.01, 0.05]) for _ in range(WORLD)]
    g = rng.choice([8, 9, 31, 64, 256, 1000])
    caps = [max(1, int(g * rng.uniform(0.05, 0.6))) for _ in range(WORLD)]
    while sum(caps) < g:  # feasible: raise caps until the batch fits
        caps[rng.randrange(WORLD)] += g // WORLD + 1
    return g, rates, fixed, caps


@pytest.mark.parametrize("seed", range(40))
def test_timed_split_at_8_ranks_is_as_good_as_the_greedy_optimum(seed):
    g, rates, fixed, caps = _cluster(random.Random(seed))
    sizes = split_batch_timed(g, rates, fixed, max_per_rank=caps)
    assert sum(sizes) == g
    assert all(1 <= b <= c for b, c in zip(sizes, caps)), (sizes, caps)  # never 0 samples, caps honoured
    best = _makespan(_greedy(g, rates, fixed, caps), rates, fixed)
    # rounding to whole samples may cost at most one sample on the slowest rank
    assert _makespan(sizes, rates, fixed) <= best + 1 / min(rates) + 1e-12


@pytest.mark.parametrize("seed", range(20))
def test_capacity_split_at_8_ranks_honours_caps_and_never_starves(seed):
    rng = random.Random(1000 + seed)
    g, _, _, caps = _cluster(rng)
    capacities = [rng.uniform(0.01, 1.0) for _ in range(WORLD)]
    capacities[rng.randrange(WORLD)] = 1e-6  # a nearly useless rank still gets a sample
    sizes = split_batch(g, capacities, caps)
    assert sum(sizes) == g and all(1 <= b <= c for b, c in zip(sizes, caps))


def test_split_refuses_caps_that_cannot_hold_the_batch():
    with pytest.raises(ValueError, match="max_batch_sizes=.* allow only 8 samples but the global batch is 9"):
        split_batch(9, [1.0] * WORLD, [1] * WORLD)


def test_sampler_at_8_ranks_tiles_one_process_order():
    sizes = [1, 2, 3, 5, 8, 13, 21, 11]  # G = 64
    n = 64 * 3 + 17  # a partial last batch with more samples than ranks
    per_rank = [list(HeteroBatchSampler(n, sizes, r, shuffle=True, seed=5)) for r in range(WORLD)]
    whole = list(HeteroBatchSampler(n, sizes, None, shuffle=True, seed=5))  # every rank's slice in turn
    assert all(len(p) == 4 for p in per_rank)  # every rank runs the same number of steps
    for step in range(4):
        joined = [i for r in range(WORLD) for i in per_rank[r][step]]
        assert joined == [i for b in whole[step * WORLD:(step + 1) * WORLD] for i in b]
        assert all(len(per_rank[r][step]) >= 1 for r in range(WORLD))
    order = [i for step in range(4) for r in range(WORLD) for i in per_rank[r][step]]
    assert sorted(order) == list(range(n))  # each sample exactly once per epoch
