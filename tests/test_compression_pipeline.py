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


def _train(rank: int, world: int, method: str, density: float) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.hooks import CompressedState, topk_ef, topk_hook
    from hetero_strategy.precision import CoordinatedScaler

    init_gloo(rank, world)
    issued, real_issue = [], topk_ef.issue_chunk
    # count chunks, and those holding sparse and dense parameters at once (decoded both ways)
    topk_ef.issue_chunk = lambda st, c: issued.append(any(c.sparse) and not all(c.sparse)) or real_issue(st, c)
    x = torch.randn(64, 7, generator=torch.Generator().manual_seed(rank))
    y = torch.randn(64, 3, generator=torch.Generator().manual_seed(10 + rank))
    out, chunks, mixed = {}, {}, 0
    for stages in [*STAGES, "side"]:  # "side": 3 stages with side_streams (no streams on the CPU)
        issued.clear()
        model = DistributedDataParallel(_net())
        extra = dict(tiers=["ib", "eth1g"], tier_overrides=OVERRIDES) if method == "tiered" else {}
        state = CompressedState(method=method, dense_fallback=False, base_density=density, min_density=0.05,
                                dense_warmup_steps=1, dense_sync_every=4, side_streams=stages == "side",
                                pipeline_stages=3 if stages == "side" else stages, **extra)
        state.set_local_batch([16, 48][rank], 64)
        model.register_comm_hook(state, topk_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = CoordinatedScaler(enabled=False)  # skips a non-finite step on every rank
        for s in range(7):
            # step 3: an inf in one parameter's gradient on rank 1 only: the other chunks are finite
            handle = model.module[2].bias.register_hook(lambda g: g * float("inf")) if s == 3 and rank else None
            nn.functional.mse_loss(model(x[s * 8:(s + 1) * 8]), y[s * 8:(s + 1) * 8]).backward()
            if handle is not None:
                handle.remove()
            scaler.step(opt)
            opt.zero_grad()
        out[stages] = [p.detach().clone() for p in model.parameters()]
        chunks[stages], mixed = len(issued), mixed + sum(issued)
    return {"weights": out, "chunks": chunks, "mixed": mixed, "skipped": scaler.skipped_steps}


@pytest.mark.parametrize(("method", "density"), [("topk", 0.3), ("tiered", 0.3), ("topk", 0.45)])
def test_pipelined_exchange_equals_one_chunk_bitwise(method, density):
    ranks = run_distributed(_train, 2, method, density, timeout=180)
    if density == 0.45:  # some parameters go dense (cap x W >= n): chunks mixing both kinds
        assert all(rank["mixed"] > 0 for rank in ranks)
    for rank in ranks:
        assert rank["skipped"] == 1  # the inf step, on both ranks
        for stages in [*STAGES[1:], "side"]:
            for a, b in zip(rank["weights"][stages], rank["weights"][1]):
                assert torch.equal(a, b), f"{stages} stages differ from one chunk"
        # 6 parameters in one bucket: the chunks really were cut (7 steps, the first one dense)
        assert rank["chunks"][1] == 6 and rank["chunks"][3] == 6 * 3 and rank["chunks"][8] > 6 * 3
    for a, b in zip(ranks[0]["weights"][5], ranks[1]["weights"][5]):
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
    for method in ("none", "fp16", "bf16", "powersgd", "onebit"):  # accepted there, it would do nothing
        with pytest.raises(ConfigError, match=f"pipeline_stages=4 is invalid: .*not compression='{method}'"):
            CompressionConfig(method=method, pipeline_stages=4)


def test_side_streams_without_a_codec_are_refused():
    with pytest.raises(ConfigError, match="side_streams=True is invalid.*not compression='fp16'"):
        CompressionConfig(method="fp16", side_streams=True)
