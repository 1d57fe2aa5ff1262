"""Semantics 1-2 on the sampler alone, against hand-built single-process orders."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader

from hetero_strategy.balance import HeteroBatchSampler, split_batch


def _single_process_batches(n, g, shuffle, seed, epoch, drop_last):
    """What DataLoader(batch_size=g) over a seeded randperm (or range) yields in one process."""
    order = list(range(n))
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    batches = [order[i:i + g] for i in range(0, n, g)]
    return batches[:-1] if drop_last and len(batches[-1]) < g else batches


@pytest.mark.parametrize("n", [1, 7, 16, 70, 81])
@pytest.mark.parametrize("sizes", [[3, 13], [1, 1, 1, 1], [5, 2, 9]])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_together_consume_the_single_process_batches(n, sizes, shuffle, drop_last):
    g = sum(sizes)
    for epoch in (0, 3):
        samplers = [HeteroBatchSampler(n, sizes, r, shuffle=shuffle, seed=7, drop_last=drop_last)
                    for r in range(len(sizes))]
        for s in samplers:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in samplers]
        expected = _single_process_batches(n, g, shuffle, 7, epoch, drop_last)
        assert all(len(b) == len(expected) == len(s) for b, s in zip(per_rank, samplers))  # same step count
        for t, want in enumerate(expected):
            plan = samplers[0].plan(t)
            got = []
            for r in range(len(sizes)):
                if plan.sizes[r] == 0:  # padding rank: one sample, zero weight
                    assert len(per_rank[r][t]) == 1 and plan.weight(r) == 0
                else:
                    assert len(per_rank[r][t]) == plan.sizes[r]
                    got += per_rank[r][t]  # contiguous slices in rank order
            assert got == want
            assert sum(plan.weight(r) for r in range(len(sizes))) == pytest.approx(1.0)
            if len(want) == g:
                assert plan.sizes == sizes


def test_dataloader_with_the_batch_sampler_yields_the_slices():
    data = torch.arange(20)
    loader = DataLoader(data, batch_sampler=HeteroBatchSampler(20, [2, 6], rank=1))
    assert [b.tolist() for b in loader] == [[2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15], [17, 18, 19]]  # last 4 split 1:3


def test_schedule_changes_split_but_not_samples():
    s0, s1 = (HeteroBatchSampler(64, [8, 8], r, shuffle=True) for r in range(2))
    for s in (s0, s1):
        s.set_batch_sizes([4, 12], from_step=2)
    b0, b1 = list(s0), list(s1)
    assert [len(b) for b in b0] == [8, 8, 4, 4]
    expected = _single_process_batches(64, 16, True, 0, 0, False)
    assert [x + y for x, y in zip(b0, b1)] == expected
    state = s0.state_dict()
    fresh = HeteroBatchSampler(64, [8, 8], 0, shuffle=True)
    fresh.load_state_dict(state)
    assert list(fresh) == b0
    with pytest.raises(ValueError, match="summing to the global batch 16"):
        s0.set_batch_sizes([4, 4], from_step=5)


@pytest.mark.parametrize("g, caps, cap_max", [
    (16, [1.0, 0.57], None), (17, [1, 1, 1], None), (4, [100, 1, 1, 1], None), (10, [1, 1, 1], [2, 100, 3]),
    (1000, [0.3, 0.2, 0.5], None), (7, [1e-6, 1.0], None),
])
def test_split_is_exact_bounded_and_proportional(g, caps, cap_max):
    sizes = split_batch(g, caps, cap_max)
    assert sum(sizes) == g and min(sizes) >= 1
    if cap_max:
        assert all(b <= m for b, m in zip(sizes, cap_max))
    else:
        ideal = [g * c / sum(caps) for c in caps]
        if min(ideal) >= 1:  # largest remainder: each size within one sample of its ideal
            assert all(abs(b - i) < 1 for b, i in zip(sizes, ideal))
        else:  # ranks raised to 1 sample take it from the largest
            assert sizes[ideal.index(max(ideal))] == g - (len(caps) - 1)


def test_split_rounds_by_largest_remainder():
    assert split_batch(16, [1.0, 0.57]) == [10, 6]   # 10.19 / 5.81
    assert split_batch(10, [1, 1, 1]) == [4, 3, 3]   # equal remainders: lower rank first
    assert split_batch(10, [1, 1, 1], [2, 100, 3]) == [2, 5, 3]
    with pytest.raises(ValueError, match="smaller than 3"):
        split_batch(2, [1, 1, 1])


def test_step_count_matches_dataloader():
    for n, g, drop in [(70, 16, False), (70, 16, True), (64, 16, True)]:
        s = HeteroBatchSampler(n, [3, 13], 0, drop_last=drop)
        assert len(s) == (n // g if drop else math.ceil(n / g))


def test_capacity_model_by_hand():
    from hetero_strategy.balance import capacity

    # alpha * compute share + beta * bandwidth share
    got = capacity([2.0, 1.0], [10.0, 30.0], alpha=0.7, beta=0.3)
    assert got == pytest.approx([0.7 * 2 / 3 + 0.3 * 0.25, 0.7 * 1 / 3 + 0.3 * 0.75])
    assert capacity([2.0, 1.0]) == pytest.approx([2 / 3, 1 / 3])  # no bandwidth figures: compute only
    with pytest.raises(ValueError, match="positive measured speed"):
        capacity([1.0, 0.0])


def test_a_restored_position_skips_the_trained_steps_of_its_epoch_only():
    from hetero_strategy.balance import HeteroBatchSampler

    ref = HeteroBatchSampler(40, [3, 5], rank=1, shuffle=True, seed=2)
    ref.set_epoch(1)
    epoch1 = list(ref)  # 5 steps of G=8
    s = HeteroBatchSampler(40, [3, 5], rank=1, shuffle=True, seed=2)
    s.resume_at(5 + 2)  # epoch 1, after 2 trained steps
    s.set_epoch(1)
    assert list(s) == epoch1[2:]
    s.set_epoch(2)
    assert len(list(s)) == 5  # the next epoch is whole again
    t = HeteroBatchSampler(40, [3, 5], rank=1, shuffle=True, seed=2)
    t.resume_at_samples(1, 23)  # another world's position: 23 samples seen -> 2 whole batches of 8
    assert t.position == (1, 16)
    t.set_epoch(1)
    assert list(t) == epoch1[2:]


def test_a_state_saved_under_another_global_batch_keeps_this_split_and_the_sample_position():
    """The loader's batch size changed between save and resume: the saved split (G = 8) is not
    this run's (G = 16); the epoch goes on from the saved sample, 24, rounded down to whole batches."""
    from hetero_strategy.balance import HeteroBatchSampler

    old = HeteroBatchSampler(64, [2, 6], rank=1, shuffle=True, seed=3)
    old.resume_at(8 + 3)  # epoch 1 (8 steps of 8), after 3 trained steps: 24 samples
    old.set_epoch(1)
    new = HeteroBatchSampler(64, [4, 12], rank=1, shuffle=True, seed=3)
    assert new.load_state_dict(old.state_dict()) is False
    assert new.batch_sizes == [4, 12] and new.position == (1, 16)
    ref = HeteroBatchSampler(64, [4, 12], rank=1, shuffle=True, seed=3)
    ref.set_epoch(1)
    assert list(new) == list(ref)[1:]  # one whole batch of 16 done; samples 16-23 are seen again
    same = HeteroBatchSampler(64, [2, 6], rank=1, shuffle=True, seed=3)
    assert same.load_state_dict(old.state_dict()) is True and same.position == (1, 24)
