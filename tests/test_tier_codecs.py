"""A codec per link tier (tier_overrides.<tier>.codec): the slowest tier's codec runs on every rank.

Oracles: the sample-weighted dense gradient Σ b_r g_r / G from per-rank local gradients, and the
configuration errors by hand. A linear layer's weight gradient over a batch of 8 has rank <= 8,
so PowerSGD at rank 8 reconstructs it exactly and its weighting is checked exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from oracle import weighted_reference
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_strategy.config import CompressionConfig, ConfigError, HeteroConfig
from hetero_strategy.hooks import CastState, CompressedState, PowerSGDBaselineState, build_comm_hook
from hetero_strategy.hooks.tiers import exchange_codec, tier_policy


def test_the_slowest_tier_decides_and_dense_means_dense() -> None:
    overrides = {"ib": {"codec": "topk_allreduce"}, "eth1g": {"codec": "powersgd", "rank": 2},
                 "eth10g": {"codec": "dense"}}
    pol = {t: tier_policy(t, overrides) for t in ("nvlink", "ib", "eth10g", "eth1g")}
    assert exchange_codec("tiered", ["ib", "eth1g", "ib"], [pol["ib"], pol["eth1g"], pol["ib"]]) == ("powersgd", pol["eth1g"])
    assert exchange_codec("tiered", ["nvlink", "ib"], [pol["nvlink"], pol["ib"]])[0] == "topk_allreduce"
    assert exchange_codec("tiered", ["ib", "eth10g"], [pol["ib"], pol["eth10g"]])[0] == "dense"
    assert pol["eth10g"].tier_factor is None  # codec dense is a dense tier
    assert exchange_codec("tiered", ["nvlink", "nvlink"], [pol["nvlink"]] * 2)[0] == "dense"
    assert exchange_codec("topk", None, [pol["ib"]])[0] == "topk"


@pytest.mark.parametrize(("overrides", "method", "message"), [
    ({"eth1g": {"codec": "gzip"}}, "tiered", r"tier_overrides.eth1g.codec='gzip' is invalid: choose one of dense"),
    ({"eth1g": {"codec": "powersgd", "rank": 0}}, "tiered", r"tier_overrides.eth1g.rank=0 is invalid"),
    ({"eth1g": {"codec": "fp16"}}, "topk", r"tier_overrides.eth1g.codec='fp16' is invalid: a tier's codec applies"),
])
def test_bad_tier_codecs_fail_at_construction(overrides, method, message) -> None:
    with pytest.raises(ConfigError, match=message):
        CompressionConfig(method=method, tier_overrides=overrides)


def _worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    tiers = ["ib", "eth1g"]
    # rank 8 >= the weight gradient's rank (8 samples): PowerSGD's reconstruction is exact
    cfg = HeteroConfig.from_flat(compression="tiered", tiers=tiers, dense_warmup_steps=2, dense_fallback=False,
                                 tier_overrides={"eth1g": {"codec": "powersgd", "rank": 8}})
    state, hook = build_comm_hook(cfg)
    assert isinstance(state, PowerSGDBaselineState) and state.powersgd.matrix_approximation_rank == 8
    torch.manual_seed(0)
    ref = nn.Linear(100, 64)
    model = DDP(copy.deepcopy(ref), bucket_cap_mb=100)
    model.register_comm_hook(state, hook)
    sizes = [3, 5]
    lo = sum(sizes[:rank])
    for step in range(5):  # 0-1 dense (start_iter 2), then compressed
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 100, generator=gen), torch.randn(8, 64, generator=gen)
        state.set_local_batch(sizes[rank], 8)
        model.zero_grad()
        nn.functional.mse_loss(model(x[lo:lo + sizes[rank]]), y[lo:lo + sizes[rank]]).backward()
        for p, want in zip(model.parameters(), weighted_reference(ref, x, y, sizes)):
            # fp32 Gram-Schmidt leaves ~1e-5 relative; weighting by 1/W instead of b_r/G would be ~25%
            error = float((p.grad - want).norm() / want.norm())
            assert error < (1e-6 if step < 2 else 1e-3), f"step {step}: relative error {error:.2e}"
    assert state.powersgd.total_numel_after_compression < state.powersgd.total_numel_before_compression / 2
    # the other codecs of the slowest tier
    for codec, kind in (("fp16", CastState), ("topk_allreduce", CompressedState), ("onebit", CompressedState)):
        cfg = HeteroConfig.from_flat(compression="tiered", tiers=tiers, tier_overrides={"eth1g": {"codec": codec}})
        state, _ = build_comm_hook(cfg)
        assert isinstance(state, kind), codec
        if codec == "topk_allreduce":
            assert state.codec == codec and state.topk.agreement is not None
    # a hierarchy's leaders exchange with Top-K codecs only: every rank refuses alike
    cfg = HeteroConfig.from_flat(compression="tiered", tiers=tiers, hierarchical=True, fast_groups=[[0], [1]],
                                 tier_overrides={"eth1g": {"codec": "powersgd"}})
    with pytest.raises(ValueError, match="codec='powersgd' is invalid with hierarchical=True"):
        build_comm_hook(cfg)


def test_tier_codecs_build_and_powersgd_stays_sample_weighted() -> None:
    """Two ranks on tiers ib and eth1g with unequal batches (3/5): eth1g's PowerSGD runs for both and
    gives Σ b_r g_r / G exactly at full rank; fp16, topk_allreduce and onebit build their states."""
    run_distributed(_worker, 2, timeout=120)
