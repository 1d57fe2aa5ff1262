"""Per-rank micro-batching: a share above the rank's memory cap runs as passes, and the step stays exact."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, loader, make_data, one_process_sgd, trainer_kwargs

from hetero_strategy.runtime.micro import pass_sizes, split_batch_tree


@pytest.mark.parametrize("share, cap, want", [
    (5, 2, [2, 2, 1]), (5, None, [5]), (5, 5, [5]), (6, 4, [3, 3]), (7, 3, [3, 2, 2]), (1, 1, [1]),
])
def test_a_share_runs_as_the_fewest_passes_within_the_cap(share, cap, want):
    assert pass_sizes(share, cap) == want


def test_a_batch_is_cut_along_its_first_dimension_wherever_it_nests():
    Pair = namedtuple("Pair", "a b")
    x, y = torch.arange(10).view(5, 2), torch.arange(5)
    batch = {"x": x, "pair": Pair(y, torch.tensor(7.0)), "ids": ["a", "b", "c", "d", "e"], "n": 5}
    first, second = split_batch_tree(batch, [3, 2])
    assert torch.equal(first["x"], x[:3]) and torch.equal(second["x"], x[3:])
    assert torch.equal(second["pair"].a, y[3:]) and second["pair"].b.item() == 7.0  # a scalar is shared
    assert first["ids"] == ["a", "b", "c"] and second["ids"] == ["d", "e"] and second["n"] == 5


def test_a_batch_with_nothing_of_the_shares_length_is_refused_not_run_whole_in_every_pass():
    # a share of 5 as passes [3, 2], but the collate put the samples along dim 1
    with pytest.raises(ValueError, match=r"share of 5 samples runs as passes of \[3, 2\].*\{'x': tensor\[2, 5\]\}\) "
                                         r"has 5 items along dim 0"):
        split_batch_tree({"x": torch.zeros(2, 5)}, [3, 2])
    assert len(split_batch_tree({"x": torch.zeros(2, 5)}, [5])) == 1  # one pass: the batch as it is


class _NoBatchIdx(Regressor):
    """A training_step without batch_idx: Lightning then passes the batch alone."""

    def training_step(self, batch):
        return super().training_step(batch, 0)


def _ranks(rank: int, world_size: int) -> dict:
    import lightning as L

    from hetero_strategy import HeteroFSDPStrategy, HeteroStrategy

    out = {}
    for name, cls in (("ddp", HeteroStrategy), ("fsdp", HeteroFSDPStrategy)):
        for accumulate in (1, 2):
            model = Regressor()
            # rank 1's share of 5 runs as passes of 2, 2 and 1 (cap 2); rank 0's 3 in one
            trainer = L.Trainer(strategy=cls(batch_sizes=[3, 5], max_batch_sizes=[8, 2]), max_steps=8 // accumulate,
                                **trainer_kwargs(accumulate_grad_batches=accumulate))
            trainer.fit(model, loader(make_data(80), 4))
            out[f"{name}_{accumulate}"] = ([_whole(p) for p in model.net.parameters()], model.seen)
    model = _NoBatchIdx()
    trainer = L.Trainer(strategy=HeteroStrategy(batch_sizes=[3, 5], max_batch_sizes=[8, 2]), max_steps=8,
                        **trainer_kwargs())
    trainer.fit(model, loader(make_data(80), 4))
    out["no_batch_idx"] = ([_whole(p) for p in model.net.parameters()], model.seen)
    # caps below the even split (4 + 4 > 2 + 2): the shares still follow capacity, run as passes
    model = Regressor()
    trainer = L.Trainer(strategy=HeteroFSDPStrategy(capacities=[1.0, 1.0], max_batch_sizes=[2, 2]), max_steps=4,
                        **trainer_kwargs())
    trainer.fit(model, loader(make_data(80), 4))
    out["below"] = ([_whole(p) for p in model.net.parameters()], model.seen, trainer.strategy.sampler.batch_sizes)
    return out


def _whole(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(_ranks, 2, timeout=300)


def _close(got, want) -> None:
    for g, w in zip(got, want.parameters(), strict=True):
        torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_micro_batched_rank_keeps_one_process_sgd(ranks, name, accumulate):
    oracle = one_process_sgd(make_data(80), 8, 8 // accumulate, accumulate=accumulate)
    r0, r1 = (r[f"{name}_{accumulate}"] for r in ranks)
    assert r0[1] == [3] * 8 and r1[1] == [2, 2, 1] * 8  # training_step saw every pass
    _close(r0[0], oracle)
    _close(r1[0], oracle)


def test_caps_below_the_even_split_run_as_passes_not_as_an_error(ranks):
    weights, seen, sizes = ranks[1]["below"]
    assert sizes == [4, 4] and seen == [2, 2] * 4
    _close(weights, one_process_sgd(make_data(80), 8, 4))


def test_a_training_step_without_batch_idx_keeps_its_earlier_passes(ranks):
    weights, seen = ranks[1]["no_batch_idx"]
    assert seen == [2, 2, 1] * 8
    _close(weights, one_process_sgd(make_data(80), 8, 8))
