"""The probe under FSDP2 (2 gloo ranks): each rank times its own compute, and leaves no gradient behind."""

from __future__ import annotations

import pytest
from dist_utils import init_gloo, run_distributed

#: seconds per sample of each block's forward: rank 1 is eight times slower than rank 0
PER_SAMPLE_S = (0.0005, 0.004)


def _ranks(rank: int, world_size: int) -> dict:
    import time

    import torch
    from torch import nn

    from hetero_strategy.balance.probe import ProbeExchange, probe_step_cost
    from hetero_strategy.runtime.fsdp import ShardedReduction, shard_model

    init_gloo(rank, world_size)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            time.sleep(PER_SAMPLE_S[rank] * x.shape[0])  # this rank's compute, per sample
            return torch.tanh(self.lin(x))

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(6, 1))
    reference = [p.detach().clone() for p in model.parameters()]
    reduction = ShardedReduction(shard_model(model, auto_wrap_policy="Block"), world_size, False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 6, generator=g)
    # as the runtime probes under FSDP2: its measure, wrapped by the sharded reduction
    measure = reduction.probe(lambda batches, exchange: probe_step_cost(
        model, lambda b: model(b).pow(2).mean(), batches, steps=3, exchange=exchange))
    cost = measure([(x, 16), (x[:8], 8)], ProbeExchange(dense=True))
    out = {"samples_per_s": cost.samples_per_s, "sharded": sum(p.to_local().numel() for p in model.parameters()) < sum(p.numel() for p in model.parameters())}
    # one real step after the probe: 4 samples each, weighted 1/2 and summed = the mean loss of all 8
    batch = torch.randn(8, 6, generator=g)
    reduction.weigh(model(batch[4 * rank:4 * rank + 4]).pow(2).mean()).backward()
    out["grads"] = [p.grad.full_tensor() for p in model.parameters()]
    out["reference"] = reference
    out["batch"] = batch
    return out


@pytest.fixture(scope="module")
def results():
    return run_distributed(_ranks, 2, timeout=120)


def test_each_rank_times_its_own_compute_not_the_wait_for_the_slowest(results):
    # Oracle: the sleeps. FSDP2 all-gathers inside forward and backward, so timed as it runs, rank 0
    # waits for rank 1 at every block and both come out at rank 1's pace.
    fast, slow = (r["samples_per_s"] for r in results)
    assert slow < 1 / PER_SAMPLE_S[1] / 2 * 1.1  # two blocks: 8 ms a sample
    assert fast > 3 * slow


def test_the_probes_gradients_are_dropped_and_the_model_is_sharded_again(results):
    import torch
    from torch import nn

    # Oracle: one process, the unsharded model from the same weights, on all 8 samples
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 1))
    with torch.no_grad():
        for p, w in zip(model.parameters(), results[0]["reference"]):
            p.copy_(w)
    model(results[0]["batch"]).pow(2).mean().backward()
    assert all(r["sharded"] for r in results)
    for r in results:
        for got, want in zip(r["grads"], [p.grad for p in model.parameters()]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
