"""dense_fallback's cost model: hand-built cases, the measurement agreed by every rank, the config."""

from __future__ import annotations

import pytest
from dist_utils import init_gloo, run_distributed

from hetero_strategy import ConfigError
from hetero_strategy.config import CompressionConfig
from hetero_strategy.hooks.cost import CompressionCost


def test_sparse_pays_on_hand_built_cases():
    # 4 B/s: dense costs n s; the codec 0.5 s per entry; the all-gather of cap from 2 ranks 2 cap s
    cost = CompressionCost(link_bytes_per_s=4.0, codec_s_per_entry=0.5)
    assert cost.sparse_pays(40, 9, 2)  # 20 + 18 = 38 < 40
    assert not cost.sparse_pays(40, 10, 2)  # 20 + 20 = 40: a tie is not a gain
    assert cost.sparse_pays(40, 0, 2)  # a skipped exchange still costs the codec: 20 < 40
    slow_codec = CompressionCost(link_bytes_per_s=4.0, codec_s_per_entry=1.0)
    assert not slow_codec.sparse_pays(10**6, 1, 2)  # the codec alone costs as much as sending
    assert "Gbit/s" in cost.describe()


def _measure(rank: int, world: int) -> tuple[float, float]:
    import torch

    from hetero_strategy.hooks.cost import measure_compression_cost

    init_gloo(rank, world)
    cost = measure_compression_cost(None, torch.device("cpu"))
    return cost.link_bytes_per_s, cost.codec_s_per_entry


def test_every_rank_gets_the_same_measurement():
    # each rank times its own codec; the slowest is agreed, so every rank decides alike
    (link0, codec0), (link1, codec1) = run_distributed(_measure, 2, timeout=120)
    assert (link0, codec0) == (link1, codec1)
    assert link0 > 0 and 0 < codec0 < 1e-3


def test_config_floor_and_fallback_field():
    assert CompressionConfig(method="topk").density_floor == pytest.approx(0.005)
    assert CompressionConfig(method="topk", base_density=0.2, min_density=0.001).density_floor == 0.001
    with pytest.raises(ConfigError, match="min_density=0.3 is invalid"):
        CompressionConfig(method="topk", base_density=0.2, min_density=0.3)
    with pytest.raises(ConfigError, match="dense_fallback='yes' is invalid: must be true or false"):
        CompressionConfig(method="topk", dense_fallback="yes")


def _modes(rank: int, world: int) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.hooks import CompressedState, topk_hook

    init_gloo(rank, world)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(20, 1))
    state = CompressedState(method="topk", dense_fallback=False, dense_warmup_steps=1, dense_sync_every=3)
    state.cost = CompressionCost(link_bytes_per_s=1e12, codec_s_per_entry=1.0)  # never pays
    model.register_comm_hook(state, topk_hook)
    modes, ref = [], []
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(rank))
    for _ in range(7):
        model(x).square().mean().backward()
        modes.append(sorted(set(state.last_modes.values())))
        ref.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad()
    return {"modes": modes, "residual_entries": state.memory.total_numel(), "dirty": sorted(state.dirty),
            "grads": ref}


def test_a_bucket_that_never_pays_stays_on_the_plain_all_reduce_across_dense_syncs():
    # warm-up at step 0, the periodic dense sync at steps 3 and 6, whole otherwise; no residual is
    # ever kept, and every rank takes the same path (else gloo would hang or abort)
    r0, r1 = run_distributed(_modes, 2, timeout=120)
    want = [["warmup"], ["dense_fallback"], ["dense_fallback"], ["dense"], ["dense_fallback"],
            ["dense_fallback"], ["dense"]]
    assert r0["modes"] == r1["modes"] == want
    assert r0["residual_entries"] == r1["residual_entries"] == 0 and r0["dirty"] == []
    for a, b in zip(r0["grads"], r1["grads"]):  # the same reduced gradient on both ranks
        assert all(bool((u == v).all()) for u, v in zip(a, b))
