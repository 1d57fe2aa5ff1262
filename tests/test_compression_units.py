"""Single-process checks of the compression pieces: config refusals, schedule, codecs, memory,
tiers, and the hooks on a stand-in bucket (world size 1), against hand-built values."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hetero_bench.flat_bucket import FlatBucket

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.hooks import CompressedState, onebit_hook, topk_hook
from hetero_strategy.hooks.codecs import SignCodec, TopKCodec
from hetero_strategy.hooks.memory import ResidualMemory
from hetero_strategy.hooks.schedule import DensitySchedule
from hetero_strategy.hooks.tiers import resolve_tier, tier_from_bandwidth, tier_policy


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"base_density": 0.0}, "base_density"),
    ({"base_density": 1.5}, "base_density"),
    ({"min_density": -0.1}, "min_density"),
    ({"base_density": 0.01, "min_density": 0.1}, "min_density"),
    ({"tier": "wifi"}, "tier"),
    ({"tiers": ["ib", "token-ring"]}, "tiers[1]"),
    ({"tier_overrides": {"eth1g": {"speed": 3}}}, "tier_overrides.eth1g.speed"),
    ({"tier_overrides": {"eth1g": {"gamma": 1.5}}}, "tier_overrides.eth1g.gamma"),
    ({"dense_warmup_steps": 0}, "dense_warmup_steps"),
    ({"clip_norm": -1.0}, "clip_norm"),
    ({"density_schedule": "linear"}, "density_schedule"),
    ({"compression_backend": "cuda"}, "compression_backend"),
    ({"compression": "zip"}, "compression"),
])
def test_bad_configs_are_refused_naming_field_and_fix(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        HeteroConfig.from_flat(**kwargs)
    assert str(err.value).startswith(f"{field}="), str(err.value)
    assert "invalid:" in str(err.value)


# DensitySchedule(base 0.04, floor 0.001, warm-up 10, T = 100) at tier factor 0.5, worked out by hand:
# peak = 0.04 x 0.5 = 0.02; step s >= 10 is t = s - 10 steps into the decay (1 + cos(pi t / T)) / 2.
#   s = 9   warm-up                                  -> 1.0 (dense)
#   s = 10  t = 0,    cos 0 = 1        decay 1         -> 0.02
#   s = 35  t = T/4,  cos(pi/4) = 0.70711, decay 0.85355 -> 0.0170711
#   s = 60  t = T/2,  cos(pi/2) = 0,   decay 1/2       -> 0.01
#   s = 85  t = 3T/4, cos(3pi/4) = -0.70711, decay 0.14645 -> 0.00292893
#   s = 100 t = 90,   cos(0.9 pi) = -0.95106, decay 0.02447 -> 0.00049 < floor -> 0.001
#   s = 110 t = T,    cos(pi) = -1,    decay 0         -> 0 -> 0.001; s = 10000: held at the floor
HAND_DENSITY = {9: 1.0, 10: 0.02, 35: 0.0170711, 60: 0.01, 85: 0.00292893, 100: 0.001, 110: 0.001, 10_000: 0.001}


@pytest.mark.parametrize(("step", "want"), HAND_DENSITY.items())
def test_schedule_against_a_hand_table(step: int, want: float) -> None:
    s = DensitySchedule(base_density=0.04, min_density=0.001, warmup_steps=10, period=100)
    assert s.density(step, 0.5) == pytest.approx(want, rel=1e-5)


def test_schedule_tier_factor_dense_tier_k_and_constant() -> None:
    s = DensitySchedule(base_density=0.04, min_density=0.001, warmup_steps=10, period=100)
    # tier factor: 0.04 x 1.0 x 1/2 = 0.02 at T/2; 0.04 x 0.1 = 0.004 at the decay's start
    assert s.density(60, 1.0) == pytest.approx(0.02) and s.density(10, 0.1) == pytest.approx(0.004)
    assert s.density(50, None) == 1.0 and s.density(10_000, None) == 1.0  # a dense tier stays dense
    # k = ceil(density x n), at least 1: 0.02 x 1000 = 20; 0.0170711 x 1000 = 17.07 -> 18; 0.02 x 10 -> 1
    assert s.k(1000, 10, 0.5) == 20 and s.k(1000, 35, 0.5) == 18 and s.k(10, 10, 0.5) == 1
    assert s.k(0, 10, 0.5) == 0 and s.k(1000, 5, 0.5) == 1000  # empty bucket; warm-up sends all
    const = DensitySchedule(base_density=0.04, min_density=0.001, warmup_steps=1, period=100, cosine=False)
    assert const.density(80, 0.5) == pytest.approx(0.02) and const.density(10_000, 0.5) == pytest.approx(0.02)


@pytest.mark.parametrize("k", [0, 1, 7, 50])
def test_topk_codec_sends_the_largest_and_conserves(k: int) -> None:
    acc = torch.randn(50, generator=torch.Generator().manual_seed(k))
    payload, residual = TopKCodec.compress(acc, k, capacity=max(k, 8))
    sent = TopKCodec.decompress(payload.view(1, -1), 50)
    torch.testing.assert_close(sent + residual, acc, rtol=0, atol=0)  # nothing lost, nothing added
    assert int((sent != 0).sum()) == k
    if 0 < k < 50:
        assert sent[sent != 0].abs().min() >= residual.abs().max()


def test_sign_codec_scale_per_segment() -> None:
    acc = torch.tensor([1.0, -3.0, 0.5, -0.5, 2.0])
    payload, residual = SignCodec.compress(acc, [2, 3])
    assert payload.dtype == torch.uint8 and payload.numel() == SignCodec.payload_numel(5, 2)
    decoded = SignCodec.decompress(payload.view(1, -1), [2, 3])
    torch.testing.assert_close(decoded, torch.tensor([2.0, -2.0, 1.0, -1.0, 1.0]))
    torch.testing.assert_close(decoded + residual, acc)


def _bucket(params: list[torch.Tensor], values: list[torch.Tensor], index: int = 0) -> FlatBucket:
    """A bucket of ``params`` holding ``values`` as its gradients."""
    return FlatBucket(torch.cat([v.reshape(-1) for v in values]), params, index=index)


def test_memory_keeps_residuals_per_parameter_across_layouts() -> None:
    a, b, c = torch.zeros(3), torch.zeros(2), torch.zeros(4)
    mem = ResidualMemory()
    first = _bucket([a, b, c], [torch.zeros(3), torch.zeros(2), torch.zeros(4)])
    mem.residual(0, mem.keys(first), first.gradients()).copy_(torch.arange(9.0))
    # rebuilt layout: c alone in bucket 0, then b, a in bucket 1
    r0 = mem.residual(0, mem.keys(_bucket([c], [torch.zeros(4)])), [torch.zeros(4)])
    r1 = mem.residual(1, mem.keys(_bucket([b, a], [torch.zeros(2), torch.zeros(3)])), [torch.zeros(2), torch.zeros(3)])
    assert r0.tolist() == [5.0, 6.0, 7.0, 8.0] and r1.tolist() == [3.0, 4.0, 0.0, 1.0, 2.0]
    saved = mem.state_dict()
    fresh = ResidualMemory()
    fresh.load_state_dict(saved)
    again = fresh.residual(0, fresh.keys(first), first.gradients())  # lazily re-attached
    assert again.tolist() == [float(i) for i in range(9)]


def test_tiers_from_bandwidth_env_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tier_from_bandwidth(0.1) == "eth1g" and tier_from_bandwidth(8) == "eth10g"
    assert tier_from_bandwidth(150) == "ib" and tier_from_bandwidth(900) == "nvlink"
    assert tier_policy("eth1g").exchange_every == 1 and tier_policy("nvlink").tier_factor is None
    assert tier_policy("eth1g", {"eth1g": {"exchange_every": 5}}).exchange_every == 5
    assert tier_policy("ib", {"ib": {"gamma": 0.5}}).gamma == 0.5
    monkeypatch.setenv("HETERO_TIER", "eth10g")
    assert resolve_tier(None) == "eth10g" and resolve_tier("ib") == "ib"
    monkeypatch.setenv("HETERO_TIER", "carrier-pigeon")
    with pytest.raises(ValueError, match="HETERO_TIER='carrier-pigeon' is invalid"):
        resolve_tier(None)


def _run(state: CompressedState, hook, grads: list[torch.Tensor], params) -> torch.Tensor:
    bucket = _bucket(params, [g.clone() for g in grads])
    return hook(state, bucket).wait()


def test_single_rank_hooks_conserve_and_mark_nonfinite() -> None:
    params = [torch.zeros(40), torch.zeros(30)]
    state = CompressedState(method="topk", base_density=0.1, min_density=0.1, dense_warmup_steps=1,
                            dense_sync_every=0, ef_gamma=0.5)
    g0 = [torch.randn(40), torch.randn(30)]
    torch.testing.assert_close(_run(state, topk_hook, g0, params), torch.cat(g0))  # warm-up: dense
    g1 = [torch.randn(40), torch.randn(30)]
    out = _run(state, topk_hook, g1, params)
    res = torch.cat(list(state.state_dict()["residuals"].values()))
    torch.testing.assert_close(out + res, torch.cat(g1))  # residual was 0: sent + residual = g
    assert int((out != 0).sum()) == 4 + 3
    bad = [g1[0].clone(), g1[1].clone()]
    bad[1][0] = float("inf")
    out = _run(state, topk_hook, bad, params)
    assert torch.isnan(out).all()  # surfaces, so found-inf skips the step
    after = torch.cat(list(state.state_dict()["residuals"].values()))
    torch.testing.assert_close(after, res)  # and the residual is not poisoned
    assert state.last_bytes_sent == 0  # one rank moves nothing over the wire

    ob = CompressedState(method="onebit", dense_warmup_steps=1, dense_sync_every=0)
    _run(ob, onebit_hook, g0, params)
    out = _run(ob, onebit_hook, g1, params)
    res = torch.cat(list(ob.state_dict()["residuals"].values()))
    torch.testing.assert_close(out + res, torch.cat(g1))
    assert torch.isnan(_run(ob, onebit_hook, bad, params)).all()


@pytest.mark.parametrize("case", ["sampled", "fallback"])
def test_large_topk_selects_exactly_the_largest(case: str) -> None:
    """The CPU fast path (sampled threshold, exact k-th value fallback) against torch.topk."""
    n, k = 200_000, (3000 if case == "sampled" else 9000)
    acc = torch.rand(n, generator=torch.Generator().manual_seed(3)) * 1e-3
    if case == "fallback":  # the fixed-seed sample sees only big values: too few candidates above it
        picks = torch.randint(n, (8192,), generator=torch.Generator().manual_seed(n))
        acc[picks] = 5.0 + torch.arange(8192.0)
    acc = acc * torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0)
    payload, residual = TopKCodec.compress(acc, k, capacity=k)
    sent = TopKCodec.decompress(payload.view(1, -1), n)
    want = torch.topk(acc.abs(), k).indices
    assert set(sent.nonzero().squeeze(1).tolist()) == set(want.tolist())
    torch.testing.assert_close(sent + residual, acc, rtol=0, atol=0)


def test_period_from_a_lazy_run_length() -> None:
    """T = the run's length when known only later (Lightning's estimated_stepping_batches)."""
    state = CompressedState(method="topk", base_density=0.04, min_density=0.001, dense_warmup_steps=1,
                            max_steps=lambda: 200)
    assert state.schedule.period == 1000  # not known yet
    assert state.mode(5) == "compressed" and state.schedule.period == 200
    density = 0.04 * (1 + math.cos(math.pi * 60 / 200)) / 2  # step 61 = 60 steps after the warm-up
    assert state.plan(61, [1000])[1] == [math.ceil(density * 1000)]
    unknown = CompressedState(method="topk", max_steps=lambda: float("inf"))
    unknown.mode(20)
    assert unknown.schedule.period == 1000


def test_tier_from_a_cluster_profile(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hetero_strategy.cluster.profile import SCHEMA

    monkeypatch.delenv("HETERO_TIER", raising=False)
    path = tmp_path / "cluster.json"
    rank0 = {"rank": 0, "compute_score": 1.0, "bandwidth_gbit_s": 0.1, "tier": "eth1g"}
    path.write_text(json.dumps({"schema": SCHEMA, "ranks": [rank0]}))
    state = CompressedState(method="tiered", tier_profile=str(path))
    assert state.tiers == ["eth1g"] and state.policies[0] == tier_policy("eth1g")
    path.write_text(json.dumps({"schema": SCHEMA, "ranks": [rank0, {**rank0, "rank": 1}]}))
    with pytest.raises(ValueError, match="profiles 2 ranks but the job has 1"):
        CompressedState(method="tiered", tier_profile=str(path))
    with pytest.raises(ValueError, match="tier_profile='/nonexistent.json' is invalid"):
        CompressedState(method="tiered", tier_profile="/nonexistent.json")


def test_clip_norm_bounds_the_global_norm_before_compression() -> None:
    """Each parameter is clipped to clip_norm * sqrt(n_p / N), so the whole gradient's norm is at most
    clip_norm; what is compressed (sent + kept) is the clipped gradient."""
    params = [torch.zeros(30), torch.zeros(70)]
    state = CompressedState(method="topk", base_density=0.2, min_density=0.2, dense_warmup_steps=1,
                            dense_sync_every=0, clip_norm=2.0)
    _run(state, topk_hook, [torch.zeros(30), torch.zeros(70)], params)  # warm-up: learns N = 100
    big, small = torch.full((30,), 10.0), torch.full((70,), 0.01)
    out = _run(state, topk_hook, [big, small], params)
    res = state.state_dict()["residuals"]
    got = out + torch.cat([res[state.memory.ordinal(p)] for p in params])
    want_big = big * (2.0 * math.sqrt(30 / 100) / big.norm())  # clipped
    torch.testing.assert_close(got, torch.cat([want_big, small]), rtol=1e-5, atol=1e-6)  # small: untouched
    assert got.norm() <= 2.0 + 1e-5


@pytest.mark.parametrize(("codec_over_comm", "want"), [(0.1, 2), (0.9, 2), (2.5, 4), (2.9, 4), (7.5, 8), (100.0, 8)])
def test_auto_stages_follow_the_measured_codec_and_link(codec_over_comm, want) -> None:
    """pipeline_stages="auto": N = ceil(T_codec / T_comm) + 1, bounded to 1-8, from the measured cost.
    Hand-built: 1M entries sent as 10k values + indices from each of 2 ranks over 4e8 B/s."""
    from hetero_strategy.hooks.cost import CompressionCost

    state = CompressedState(method="topk")
    state.world = 2
    t_comm = 4.0 * 10_000 * 2 / 4e8  # the gather's bytes over the link
    state.cost = CompressionCost(link_bytes_per_s=4e8, codec_s_per_entry=codec_over_comm * t_comm / 1_000_000)
    assert state.stages_for([1_000_000], [True], [10_000]) == want
    assert state.stages_for([1_000_000], [False], [1_000_000]) == 1  # nothing to encode: no pipeline
    fixed = CompressedState(method="topk", pipeline_stages=3)
    fixed.cost = state.cost
    assert fixed.stages_for([1_000_000], [True], [10_000]) == 3


def test_auto_stages_without_a_measurement_do_not_pipeline() -> None:
    """dense_fallback=False (or a world of 1) measures nothing: one chunk."""
    state = CompressedState(method="topk", dense_fallback=False)
    assert state.cost is None and state.stages_for([1_000_000], [True], [10_000]) == 1
