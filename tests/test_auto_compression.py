"""compression="auto": the decision from hand-built measurements, and the state on two gloo ranks.

Oracles: decisions worked out by hand from the byte counts of one 1000x1000 matrix (for a slow
link with free codecs, the fewest step-factor-weighted bytes win; for a free link, dense, which
does no codec work), and the sample-weighted dense gradient Σ b_r g_r / G from per-rank local
gradients (PowerSGD at rank 8 reconstructs a linear layer's rank-8 gradient exactly).
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
from hetero_strategy.hooks import PowerSGDBaselineState, build_comm_hook
from hetero_strategy.hooks.auto import AutoMeasurement, buckets_of, choose
from hetero_strategy.hooks.baselines import powersgd_weighted_hook

SHAPES = [(1000, 1000)]


def _meas(rate: float, latency: float = 0.0, codec: float = 0.0, backend: str = "gloo") -> AutoMeasurement:
    return AutoMeasurement(link_bytes_per_s=rate, latency_s=latency, topk_s_per_entry={0.01: codec, 0.05: codec},
                           cast_s_per_entry=codec, powersgd_s={r: codec * 1e6 for r in (1, 2, 4, 8)}, backend=backend)


def test_a_slow_link_with_free_codecs_takes_the_fewest_weighted_bytes() -> None:
    # 2 ranks, 1e5 B/s. Bytes a rank sends, by hand: PowerSGD rank r all-reduces P and Q, 2 x 1000 x r
    # fp32 = 8000 r bytes (a 2-rank ring sends each byte once): r8 64 kB, r4 32 kB, r2 16 kB, r1 8 kB;
    # topk_allreduce at 0.01: 10,001 values + 10,000 indices / 2 = 60 kB; dense 4 MB. Times the step
    # factors (1.05, 1.12, 1.25, 1.5, 1.9): r1's 12 kB is the least.
    d = choose(_meas(1e5), buckets_of(SHAPES), world=2, tiers=["eth1g", "eth1g"])
    assert (d.codec, d.rank, d.tier) == ("powersgd", 1, "eth1g")
    assert d.predicted_ms == pytest.approx(1e3 * 8000 / 1e5, rel=1e-6)
    # a leaders' exchange runs Top-K codecs only: topk_allreduce at 0.01 (1.9 x 60 kB < 1.25 x 300 kB)
    h = choose(_meas(1e5), buckets_of(SHAPES), world=2, tiers=["eth1g", "eth1g"], hierarchical=True)
    assert (h.codec, h.density) == ("topk_allreduce", 0.01)
    assert h.table["powersgd rank 1"] == {"excluded": 1.0}


def test_a_free_link_stays_dense_and_a_compute_heavy_step_prefers_the_less_lossy_codec() -> None:
    d = choose(_meas(1e15, codec=1e-9), buckets_of(SHAPES), world=2, tiers=["nvlink", "nvlink"])
    assert d.codec == "dense"  # every other candidate does codec work and needs as many steps or more
    # 1e7 B/s: PowerSGD r1 0.8 ms x 1.5 vs r8 6.4 ms x 1.05 -> r1 without compute; with 100 ms of
    # compute per step the factor dominates: 1.05 x 106.4 < 1.12 x 103.2 < 1.25 x 101.6 < 1.5 x 100.8,
    # and fp16's 200 ms x 1.0 and dense's 400 ms lose
    fast = _meas(1e7)
    assert choose(fast, buckets_of(SHAPES), 2, ["eth10g"] * 2).rank == 1
    slow_step = choose(fast, buckets_of(SHAPES), 2, ["eth10g"] * 2, compute_s=0.1)
    assert (slow_step.codec, slow_step.rank) == ("powersgd", 8)


def test_powersgd_is_left_out_on_gloo_with_several_buckets() -> None:
    two = buckets_of([(1000, 1000), (1000, 1000)], cap_bytes=4_000_000)
    assert len(two) == 2
    d = choose(_meas(1e5), two, 2, ["eth1g"] * 2)
    assert d.codec == "topk_allreduce" and d.table["powersgd rank 4"] == {"excluded": 1.0}
    assert choose(_meas(1e5, backend="nccl"), two, 2, ["eth1g"] * 2).codec == "powersgd"


def test_auto_rejects_a_tier_codec_and_a_missing_model() -> None:
    with pytest.raises(ConfigError, match=r"tier_overrides.eth1g.codec='powersgd' is invalid.*auto chooses"):
        CompressionConfig(method="auto", tier_overrides={"eth1g": {"codec": "powersgd"}})
    with pytest.raises(ValueError, match="compression='auto' measures the model's buckets: pass model="):
        build_comm_hook(HeteroConfig.from_flat(compression="auto"))


def _worker(rank: int, world: int) -> dict:
    init_gloo(rank, world)
    torch.manual_seed(0)
    ref = nn.Linear(100, 64)
    model = DDP(copy.deepcopy(ref), bucket_cap_mb=100)
    said: list[str] = []
    cfg = HeteroConfig.from_flat(compression="auto", tiers=["ib", "eth1g"], dense_warmup_steps=2)
    state, hook = build_comm_hook(cfg, model=model, announce=said.append)
    first = state.decision.as_dict()
    saved = state.state_dict()
    assert saved["auto"]["codec"] == first["codec"] and "inner" in saved
    # a checkpoint of the same cluster that chose PowerSGD at rank 8: the resume keeps that choice
    other = dict(saved["auto"], codec="powersgd", rank=8, density=None)
    state.load_state_dict({"auto": other, "inner": {}})
    assert isinstance(state.inner, PowerSGDBaselineState) and state.hook is powersgd_weighted_hook
    assert state.inner.powersgd.matrix_approximation_rank == 8
    # ... and one of another cluster (4 ranks): this run's decision stands
    state.load_state_dict({"auto": dict(other, world=4, codec="dense", rank=None), "inner": {}})
    assert state.decision.codec == "powersgd"
    model.register_comm_hook(state, hook)
    sizes = [3, 5]
    lo = sum(sizes[:rank])
    for step in range(5):  # 0-1 dense (start_iter 2), then PowerSGD
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 100, generator=gen), torch.randn(8, 64, generator=gen)
        state.set_local_batch(sizes[rank], 8)  # reaches the chosen state
        model.zero_grad()
        nn.functional.mse_loss(model(x[lo:lo + sizes[rank]]), y[lo:lo + sizes[rank]]).backward()
        for p, want in zip(model.parameters(), weighted_reference(ref, x, y, sizes)):
            error = float((p.grad - want).norm() / want.norm())
            assert error < (1e-6 if step < 2 else 1e-3), f"step {step}: relative error {error:.2e}"
    assert state.last_bytes_sent > 0 and state.auto_predicted_ms == other["predicted_ms"]
    return {"decision": first, "said": said}


def test_every_rank_takes_the_same_decision_and_a_resume_keeps_it() -> None:
    """Two ranks (tiers ib, eth1g) decide alike; rank 0 alone says it; a resume on the same cluster
    switches to the saved codec, which then reduces Σ b_r g_r / G under batches 3/5."""
    out = run_distributed(_worker, 2, timeout=180)
    assert out[0]["decision"] == out[1]["decision"]
    assert out[0]["decision"]["tier"] == "eth1g" and out[0]["decision"]["tiers"] == ["ib", "eth1g"]
    assert out[0]["said"] and out[0]["said"][0].startswith("compression=auto: eth1g link (2 ranks")
    assert out[1]["said"] == []


def test_a_codec_must_be_clearly_faster_to_replace_dense() -> None:
    # one 1000x1000 matrix, 2 ranks, no latency: dense sends 4 MB, fp16 2 MB plus a cast of 1e6
    # entries. At 1e9 B/s dense is 4.0 ms; a 1.7 ns cast makes fp16 2.0 + 1.7 = 3.7 ms: ahead by
    # 7.5%, within the 10% margin, so dense stays; a 1.5 ns cast (3.5 ms, 12.5% ahead) takes fp16.
    m = AutoMeasurement(link_bytes_per_s=1e9, latency_s=0.0, topk_s_per_entry={0.01: 1.0, 0.05: 1.0},
                        cast_s_per_entry=1.7e-9, powersgd_s={r: 1.0 for r in (1, 2, 4, 8)})
    assert choose(m, buckets_of(SHAPES), 2, ["eth10g"] * 2).codec == "dense"
    m.cast_s_per_entry = 1.5e-9
    assert choose(m, buckets_of(SHAPES), 2, ["eth10g"] * 2).codec == "fp16"


def test_fp16_is_judged_by_its_measured_all_reduce_not_by_its_bytes() -> None:
    # Same matrix, a free cast: bytes alone make fp16 2.0 ms against dense's 4.0 ms. Where the fp16
    # all-reduce was measured as slow as the fp32 one (gloo sums fp16 on the CPU), fp16 is 4.0 ms:
    # no faster, so dense stays; measured at 0.6 of fp32's time it is 2.4 ms and wins.
    m = AutoMeasurement(link_bytes_per_s=1e9, latency_s=0.0, topk_s_per_entry={0.01: 1.0, 0.05: 1.0},
                        cast_s_per_entry=0.0, powersgd_s={r: 1.0 for r in (1, 2, 4, 8)}, fp16_time_ratio=1.0)
    assert choose(m, buckets_of(SHAPES), 2, ["eth10g"] * 2).codec == "dense"
    m.fp16_time_ratio = 0.6
    assert choose(m, buckets_of(SHAPES), 2, ["eth10g"] * 2).codec == "fp16"
