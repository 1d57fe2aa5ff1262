"""DDP's dense exchange as a profile measures it on CPU ranks (``model_step.exchange_cpu_s``), and
the planner putting it on each rank's own core."""

from __future__ import annotations

import json
import time

import pytest
import torch
from dist_utils import init_gloo, run_distributed

SPEC = "test_plan:tiny_mlp"


def _profile(tmp_path, exchange_cpu_s):
    """Two gloo CPU ranks at 0.8 and 0.4 of a core on a slow link (2.5 kB/s of payload), each
    with its timed model step; ``exchange_cpu_s`` per rank (None: not measured)."""
    from hetero_strategy.cluster.profile import SCHEMA

    ranks = []
    for k, exchange in enumerate(exchange_cpu_s):
        step = {"model": SPEC, "samples_per_s": 100.0 / (k + 1), "fixed_s": 0.01, "optimizer_s": 0.0,
                "cpu_share": 0.8 / (k + 1),
                "hook_s": {"dense": 0.01, "fp16": 0.02, "topk_allreduce density 0.01": 0.05}}
        if exchange is not None:
            step["exchange_cpu_s"] = exchange
        ranks.append({"rank": k, "device": {"kind": "cpu", "name": "cpu"}, "training_dtype": "fp32",
                      "matmul_tflops": {"fp32": 1.0}, "memory_gbps": 10.0, "compute_score": 1.0,
                      "bandwidth_gbit_s": 1.0, "tier": "eth1g", "latency_us": {"p50_us": 100.0},
                      "model_step": step})
    doc = {"schema": SCHEMA, "backend": "gloo", "ranks": ranks,
           "allreduce": [{"bytes": 1 << 10, "time_s": 1e-3, "algbw_gbit_s": 0.008, "busbw_gbit_s": 0.008},
                         {"bytes": 4_000_000, "time_s": 1600.0, "algbw_gbit_s": 2e-5, "busbw_gbit_s": 0.8}]}
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_measured_exchange_is_paid_on_each_ranks_core_and_moves_the_split(tmp_path):
    """The ranks measured 0.08 and 0.16 CPU s of exchange per step: the ring reduces as much on
    each, so both pay their mean (0.12), at their share of a core: 0.15 s at 0.8, 0.3 s at 0.4.
    A dense step pays that in place of the sweep's host share (0.2 of the bandwidth term here),
    DDP's bucket copies (hook_s["dense"], 0.01) inside it, not on top."""
    from hetero_strategy.balance.plan import predict
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster

    model = describe_model(SPEC)
    band = 4 * model.parameters / 2500
    for measured in ([0.08, 0.16], [0.16, 0.08]):  # which rank read more does not matter
        cluster = read_cluster([_profile(tmp_path, measured)])
        assert [r.exchange_cpu_s for r in cluster.ranks] == measured
        dense = predict(cluster, model, 20, "dense")
        assert dense.compute_s == pytest.approx(0.01 + 10 / 50 + 0.3)  # the 0.4-core rank, 10 samples
        # one bucket: the link's part (the measured all-reduce less its host share) follows backward
        assert dense.step_s == pytest.approx(dense.compute_s + 0.8 * band + 1e-3)
        # fp16 reduces as many entries on gloo: its hook, plus the same reduction (0.3 - 0.01)
        assert predict(cluster, model, 20, "fp16").compute_s == pytest.approx(0.01 + 10 / 50 + 0.02 + 0.29)
        # Top-K 1% all-reduces a few per cent of the entries: a few per cent of the reduction
        topk = predict(cluster, model, 20, "topk_allreduce").compute_s - (0.01 + 10 / 50 + 0.05)
        assert 0 < topk < 0.1 * 0.29
        # equal finishing: 0.01 + 0.15 + b0 / 100 = 0.01 + 0.3 + b1 / 50, b0 + b1 = 30 -> b1 = 5
        assert predict(cluster, model, 30, "dense", even=False).batch_sizes == [25, 5]


def test_without_every_ranks_exchange_the_sweeps_host_share_stands(tmp_path):
    """One rank's profile without ``exchange_cpu_s`` (an older profile, a single process): the
    planner keeps the all-reduce sweep's host share (0.2 of the bandwidth term, at the slowest
    share) for every rank, as before the measurement existed."""
    from hetero_strategy.balance.plan import predict
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster

    model = describe_model(SPEC)
    band = 4 * model.parameters / 2500
    for measured in ([0.04, None], [None, None]):
        got = predict(read_cluster([_profile(tmp_path, measured)]), model, 20, "dense")
        assert got.compute_s == pytest.approx(0.01 + 10 / 50 + 0.01 + 0.2 * band)


def _big_gradient_rank(rank: int, world: int) -> dict:
    """measure_model_step on a model whose exchange dwarfs its compute (8 MB of gradient, a few
    kFLOP per sample), beside the CPU seconds a bare all-reduce of as many bytes takes here."""
    import torch.distributed as dist

    from hetero_strategy.balance.model_step import measure_model_step

    init_gloo(rank, world)
    step = measure_model_step("test_plan_exchange:wide_linear", batch=4, steps=3, window_s=0.2)
    flat = torch.zeros(2_000_000)
    dist.all_reduce(flat)
    cpu = []
    for _ in range(5):
        c0 = time.process_time()
        dist.all_reduce(flat)
        cpu.append(time.process_time() - c0)
    return {"exchange_cpu_s": step["exchange_cpu_s"], "allreduce_cpu_s": sorted(cpu)[2]}


def wide_linear():
    """2M parameters in one layer, 1x1 inputs: the step is its exchange."""
    return torch.nn.Linear(1000, 2000), torch.randn(2, 1000)


def test_a_two_rank_profile_measures_ddps_exchange_at_least_its_all_reduce():
    """Independent oracle: a bare all-reduce of the gradient's bytes, timed by the test. DDP's
    exchange does that all-reduce and copies the buckets besides, so its CPU figure is no less
    than most of the bare one's (and not many times it: no waiting counted as work)."""
    rows = run_distributed(_big_gradient_rank, 2, timeout=180)
    for row in rows:
        assert row["exchange_cpu_s"] >= 0.6 * row["allreduce_cpu_s"], row
        assert row["exchange_cpu_s"] <= 10 * row["allreduce_cpu_s"] + 0.05, row


def test_a_single_process_profile_has_no_exchange():
    from hetero_strategy.balance.model_step import measure_model_step

    assert measure_model_step("test_plan_exchange:wide_linear", batch=4, steps=1, window_s=0.05)["exchange_cpu_s"] is None


def test_the_measured_exchange_is_rescaled_to_the_planned_ring_and_floored_by_the_sweep(tmp_path):
    """Four ranks (the two-rank mix twice): each rank's ring traffic is 2(W-1)/W = 1.5 payloads
    against 1.0 at two ranks, so the 0.4-core rank pays 0.12 x 1.5 / 0.4 = 0.45 s. A measured
    exchange of 0 (noise clamps a difference of two timings there) is not believed below the
    all-reduce sweep's host share: that prediction is the one without any measured exchange."""
    from hetero_strategy.balance.plan import predict
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster

    model = describe_model(SPEC)
    four = read_cluster([_profile(tmp_path, [0.08, 0.16])]).replicated(2)
    assert predict(four, model, 40, "dense").compute_s == pytest.approx(0.01 + 10 / 50 + 0.45)
    zero = predict(read_cluster([_profile(tmp_path, [0.0, 0.0])]), model, 20, "dense")
    unmeasured = predict(read_cluster([_profile(tmp_path, [None, None])]), model, 20, "dense")
    assert zero.compute_s == pytest.approx(unmeasured.compute_s) and zero.step_s == pytest.approx(unmeasured.step_s)


def test_a_profile_of_another_model_lends_it_no_exchange(tmp_path):
    """The profile timed tiny_mlp; planning wide_linear from it uses the card-style estimates and
    the sweep's rule, whatever tiny_mlp's exchange measured."""
    from hetero_strategy.balance.plan import predict
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster

    other = describe_model("test_plan_exchange:wide_linear")
    got = [predict(read_cluster([_profile(tmp_path, ex)]), other, 20, "dense") for ex in ([0.08, 0.16], [None, None])]
    assert got[0].compute_s == pytest.approx(got[1].compute_s) and got[0].step_s == pytest.approx(got[1].step_s)


def test_no_exchange_is_timed_over_nccl(monkeypatch):
    """NCCL takes CUDA tensors only; the profile's model is on the CPU: no DDP over that group."""
    import torch.distributed as dist

    from hetero_strategy.balance.model_step import _ExchangeWindow

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "nccl")
    assert _ExchangeWindow.start(torch.nn.Linear(2, 2), torch.zeros(1, 2), 0.1) is None
