"""Dealing a length-skewed global batch by predicted time, against hand-built cases and brute force."""

from __future__ import annotations

import itertools
import random

import pytest

from hetero_strategy.balance.costed import deal_by_cost, unit_weights


def _finish(slots, costs, shares):
    return max(sum(costs[i] for i in s) / sh for s, sh in zip(slots, shares))


def test_one_long_sample_goes_alone():
    assert deal_by_cost([9, 1, 1, 1, 1, 1, 1, 1, 1, 1], shares=[1, 1]) == [[0], [1, 2, 3, 4, 5, 6, 7, 8, 9]]


def test_a_rank_with_three_times_the_share_takes_three_times_the_cost():
    slots = deal_by_cost([1.0] * 16, shares=[3, 1])
    assert [len(s) for s in slots] == [12, 4]


def test_every_sample_once_every_rank_some_and_positions_in_order():
    rng = random.Random(0)
    costs = [rng.choice([5, 10, 200]) for _ in range(64)]
    slots = deal_by_cost(costs, shares=[8, 4, 2, 1, 1, 1, 1, 1])
    assert sorted(i for s in slots for i in s) == list(range(64))
    assert all(s and s == sorted(s) for s in slots)


@pytest.mark.parametrize("seed", range(30))
def test_close_to_the_best_assignment(seed):
    """LPT on related machines: within 2x of the optimum found by trying every assignment
    (a proven bound for this greedy; in practice far closer), and never worse than the
    count-based contiguous split of the same batch."""
    rng = random.Random(seed)
    w, n = rng.randint(2, 3), rng.randint(4, 8)
    costs = [rng.choice([1, 2, 3, 20]) for _ in range(n)]
    shares = [rng.choice([1.0, 2.0, 5.0]) for _ in range(w)]
    got = _finish(deal_by_cost(costs, shares), costs, shares)
    best = min(_finish([[i for i in range(n) if a[i] == r] for r in range(w)], costs, shares)
               for a in itertools.product(range(w), repeat=n) if len(set(a)) == w)
    assert got <= 2 * best + 1e-9


def test_beats_a_count_split_on_a_skewed_batch():
    costs = [400, 380, 20, 20, 20, 20, 20, 20]  # two long documents at the front of the order
    counts = [[0, 1, 2, 3], [4, 5, 6, 7]]  # what a count split gives two equal ranks
    assert _finish(deal_by_cost(costs, [1, 1]), costs, [1, 1]) < 0.6 * _finish(counts, costs, [1, 1])


def test_unit_weights():
    assert unit_weights([3, 5, 2, 7], [[0, 3], [1, 2]]) == ([10.0, 7.0], 17.0)


def test_too_few_samples_is_refused():
    with pytest.raises(ValueError, match="2 samples cannot give each of 3 ranks one"):
        deal_by_cost([1, 1], shares=[1, 1, 1])


def test_memory_caps_are_never_exceeded():
    slots = deal_by_cost([1.0] * 10, shares=[1, 1], caps=[3, 10])  # rank 0 could take 5 by share
    assert [len(s) for s in slots] == [3, 7]


def test_step_plans_survive_pickle_and_deepcopy():
    import copy
    import pickle

    from hetero_strategy.balance.sampler import StepPlan

    plan = StepPlan([2, 3], 5, units=([7.0, 9.0], 16.0))
    assert pickle.loads(pickle.dumps(plan)) == plan and copy.deepcopy(plan).weight(1) == 9 / 16


@pytest.mark.parametrize(("fields", "accumulate", "match"), [
    (dict(sample_cost="lengths"), 2, "invalid with gradient accumulation"),
    (dict(sample_cost="lengths", calibrate=True), 1, "invalid with calibrate=True"),
    (dict(sample_cost="missing"), 1, "has no attribute 'missing'"),
    (dict(sample_cost="lengths", loss_normalization="tokens"), 1, "a sample with 0 tokens"),
    (dict(sample_cost=lambda i: -1 if i == 2 else 1), 1, "it returned -1.0 for sample 2"),
    (dict(sample_cost=lambda i: "long"), 1, "it raised ValueError.* for sample 0"),
    (dict(sample_cost=lambda i: float("inf")), 1, "it returned inf for sample 0"),
])
def test_what_dealing_cannot_do_is_refused_up_front(fields, accumulate, match):
    from torch.utils.data import DataLoader

    from hetero_strategy.config import ConfigError, HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    class Texts(list):
        lengths = (3, 0, 5, 2)

    runtime = HeteroRuntime(HeteroConfig.from_flat(batch_sizes=[2], **fields), 0, 1)
    with pytest.raises(ConfigError, match=match):
        runtime.train_loader(DataLoader(Texts([1, 2, 3, 4]), batch_size=2), seed=0, accumulate=accumulate)


def test_a_cost_function_deals_like_the_dataset_attribute():
    """sample_cost=lambda i: len(tokens[i]) and sample_cost="lengths" name the same costs: the
    same samples go to the same ranks, step after step (two ranks' loaders, built on one process)."""
    from torch.utils.data import DataLoader

    from hetero_strategy.config import ConfigError, HeteroConfig
    from hetero_strategy.runtime.loaders import hetero_train_loader

    rng = random.Random(0)
    tokens = [[0] * rng.choice([2, 3, 40]) for _ in range(48)]

    class Texts(list):
        lengths = tuple(len(t) for t in tokens)

    def batches(spec, rank):
        loader, _ = hetero_train_loader(DataLoader(Texts(range(48)), batch_size=8, shuffle=True,
                                                   collate_fn=list), [10, 6], rank, seed=3, sample_cost=spec)
        return list(loader)

    for rank in (0, 1):
        by_attribute, by_function = batches("lengths", rank), batches(lambda i: len(tokens[i]), rank)
        assert by_attribute == by_function and len(by_attribute) == 3
    counts = [len(b) for b in batches("lengths", 0)]
    assert counts != [10, 10, 10]  # dealt by cost, not by count
    import io

    import numpy as np
    import torch

    assert batches(lambda i: np.int64(len(tokens[i])), 0) == batches("lengths", 0)  # numpy scalars too
    config = HeteroConfig.from_flat(sample_cost=lambda i: 1.0)  # accepted at construction
    record = config.to_record()  # what checkpoints store: the function by name
    assert record["balance"]["sample_cost"].startswith("<function test_a_cost_function")
    torch.save(record, io.BytesIO())  # pickles (a lambda would not)
    with pytest.raises(ConfigError, match="a YAML config can only name a dataset attribute"):
        config.to_yaml("/dev/null")
    with pytest.raises(ConfigError, match="sample_cost=3 is invalid"):
        HeteroConfig.from_flat(sample_cost=3)
