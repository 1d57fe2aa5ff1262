"""Pipelined Top-K (buckets cut into chunks whose exchanges start while the next chunk is encoded)
gives bitwise the same training as one chunk, on 2 gloo ranks, for several stage counts and
parameter sizes that do not divide evenly."""

from __future__ import annotations

import itertools

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from ef_oracle import OVERRIDES
from torch import nn

from hetero_strategy import ConfigError
from hetero_strategy.config import CompressionConfig
from hetero_strategy.hooks.exchange import chunk_bounds

STAGES = [1, 2, 3, 5, 8]


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 11), nn.Tanh(), nn.Linear(11, 3))


def _train(rank: int, world: int, method: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.hooks import CompressedState, topk_hook

    init_gloo(rank, world)
    x = torch.randn(64, 7, generator=torch.Generator().manual_seed(rank))
    y = torch.randn(64, 3, generator=torch.Generator().manual_seed(10 + rank))
    out = {}
    for stages in STAGES:
        model = DistributedDataParallel(_net())
        extra = dict(tiers=["ib", "eth1g"], tier_overrides=OVERRIDES) if method == "tiered" else {}
        state = CompressedState(method=method, dense_fallback=False, base_density=0.3, min_density=0.05,
                                dense_warmup_steps=1, dense_sync_every=4, pipeline_stages=stages, **extra)
        state.set_local_batch([16, 48][rank], 64)
        model.register_comm_hook(state, topk_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for s in range(7):
            nn.functional.mse_loss(model(x[s * 8:(s + 1) * 8]), y[s * 8:(s + 1) * 8]).backward()
            opt.step()
            opt.zero_grad()
        out[stages] = [p.detach().clone() for p in model.parameters()]
    return out


@pytest.mark.parametrize("method", ["topk", "tiered"])
def test_pipelined_exchange_equals_one_chunk_bitwise(method):
    ranks = run_distributed(_train, 2, method, timeout=180)
    for rank in ranks:
        for stages in STAGES[1:]:
            for a, b in zip(rank[stages], rank[1]):
                assert torch.equal(a, b), f"{stages} stages differ from one chunk"
    for a, b in zip(ranks[0][5], ranks[1][5]):
        assert torch.equal(a, b)


def test_chunks_cover_the_bucket_at_parameter_boundaries():
    sizes = [5, 1, 1, 30, 2, 9]
    for stages in range(1, 9):
        bounds = chunk_bounds(sizes, stages)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(sizes) and len(bounds) <= stages
        assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in itertools.pairwise(bounds))
    assert chunk_bounds([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    assert chunk_bounds([100], 4) == [(0, 1)]  # one parameter is never split


def test_bad_stage_counts_are_refused():
    with pytest.raises(ConfigError, match="pipeline_stages=9 is invalid"):
        CompressionConfig(method="topk", pipeline_stages=9)
