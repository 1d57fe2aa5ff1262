"""The setup probe's timing with a competing all-reduce (2 gloo ranks)."""

from __future__ import annotations

import time
import types

import pytest
from dist_utils import init_gloo, run_distributed


def _probe_ranks(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    from hetero_strategy.balance.probe import measure_step_seconds
    from hetero_strategy.balance.timing import measure_steps
    init_gloo(rank, world_size)
    out = {}

    def step(start_comm) -> None:
        # Rank 1 never starts the exchange itself: the probe must still join it, or rank 0 hangs.
        if rank == 0:
            start_comm()
        time.sleep(0.05 if rank == 0 else 0.3)

    def idle(start_comm) -> None:
        start_comm()

    out["seconds"], out["idle"] = measure_step_seconds([step, idle], steps=3, warmup=1, comm_numel=1000)
    calls = []

    def short(start_comm) -> None:  # rank 1 at half rank 0's speed; each step joins the all-reduce
        calls.append(None)
        start_comm()
        time.sleep(0.002 if rank == 0 else 0.004)

    (out["window"],) = measure_steps([short], steps=3, warmup=1, comm_numel=1000, min_seconds=0.02)
    out["calls"] = len(calls)
    # The ranks are still in step: one more collective completes and sums as expected.
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    out["sum"] = t.item()
    return out


@pytest.fixture(scope="module")
def results():
    return run_distributed(_probe_ranks, 2, timeout=60)


def test_probe_times_only_its_own_step_and_keeps_ranks_in_step(results):
    # Oracle: the sleeps (50 ms, 300 ms). Rank 0 must not count its wait for slower rank 1, which
    # would make its figure at least 300 ms; the wide margin keeps a loaded machine from failing it.
    assert 0.05 <= results[0]["seconds"] < 0.2
    assert results[1]["seconds"] >= 0.3
    # The second, interleaved step function does nothing: its figure must not carry the sleeps.
    assert all(r["idle"] < 0.1 for r in results)
    assert [r["sum"] for r in results] == [3.0, 3.0]


def test_windows_have_as_many_steps_on_every_rank_and_last_long_enough_on_the_fastest(results):
    # Oracle: the sleeps (2 ms, 4 ms). Every rank runs as many steps (each joins one all-reduce, so
    # unequal counts would hang); a window holds ceil(20 ms / the fastest warm-up step) steps: at
    # most 10, since no sleep of 2 ms ends sooner, and fewer when a loaded machine overran it.
    assert results[0]["calls"] == results[1]["calls"]
    reps = (results[0]["calls"] - 1) / 3
    assert reps == int(reps) and 1 <= reps <= 10
    assert results[0]["window"].seconds >= 0.002 and results[1]["window"].seconds >= 0.004


def _one_rank_fails(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    from hetero_strategy.balance.probe import ProbeError, measure_step_seconds
    init_gloo(rank, world_size)

    def step(start_comm) -> None:
        if rank == 1:  # e.g. out of memory on the smallest device, before the exchange starts
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        start_comm()

    try:
        measure_step_seconds([step], steps=2, warmup=1, comm_numel=1000)
        message = "no error"
    except ProbeError as e:
        message = str(e)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the ranks are still in step afterwards
    return {"message": message, "sum": t.item()}


def test_a_step_failing_on_one_rank_fails_the_probe_on_every_rank_without_a_hang():
    out = run_distributed(_one_rank_fails, 2, timeout=60)
    assert "out of memory (simulated)" in out[1]["message"]
    assert "failed on rank(s) [1]" in out[0]["message"]
    assert [r["sum"] for r in out] == [3.0, 3.0]


def test_the_codec_work_of_a_compressed_exchange_lands_in_the_fixed_cost(monkeypatch):
    # A stand-in codec with a known, batch-independent cost: the two-point fit must put it in the
    # fixed part (not the rate) and run it once per timed step.
    import torch

    from hetero_strategy.balance.probe import ProbeExchange, probe_step_cost
    from hetero_strategy.hooks import cost

    calls = []

    def fake_codec(numel, device, backend, density):
        calls.append((numel, backend, density))
        return types.SimpleNamespace(run=lambda: time.sleep(0.1))

    monkeypatch.setattr(cost, "CodecWork", fake_codec)
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 2)
    batches = [((torch.randn(n, 8),), n) for n in (16, 8)]

    def loss(b):  # 10 ms per sample: a known rate for the fit to find beside the fixed part
        time.sleep(0.01 * len(b[0]))
        return net(b[0]).sum()

    plain = probe_step_cost(net, loss, batches, steps=3, exchange=ProbeExchange(dense=False))
    coded = probe_step_cost(net, loss, batches, steps=3,
                            exchange=ProbeExchange(dense=False, codec_density=0.02, codec_backend="torch"))
    assert calls == [(8 * 2 + 2, "torch", 0.02)]  # built once, for the gradient's size
    assert plain.fixed_s < 0.05 and 60 < plain.samples_per_s < 150
    assert 0.08 < coded.fixed_s < 0.3 and 60 < coded.samples_per_s < 150  # the 0.1 s codec, at the same rate
    assert all(p.grad is None for p in net.parameters())


def test_the_probe_times_what_each_method_exchanges():
    from hetero_strategy.balance.probe import ProbeExchange
    from hetero_strategy.config import CompressionConfig
    from hetero_strategy.runtime.planner import probe_exchange

    assert probe_exchange(CompressionConfig()) == ProbeExchange(dense=True)
    assert probe_exchange(CompressionConfig(overlap_comm=False)) == ProbeExchange(dense=False)
    for method in ("topk", "tiered"):
        got = probe_exchange(CompressionConfig(method=method, base_density=0.01, compression_backend="torch"))
        assert got == ProbeExchange(dense=False, codec_density=0.01, codec_backend="torch")
    assert probe_exchange(CompressionConfig(method="fp16")) == ProbeExchange(dense=False)
