"""HeteroRuntime on bare DistributedDataParallel (no framework): one-process semantics, probe, metrics, state."""

from __future__ import annotations

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from oracle import make_data, make_net, one_process_sgd


def _train(rank: int, world: int, flat: dict, steps: int) -> dict:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from hetero_strategy.balance.probe import probe_step_cost
    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    net = make_net()
    runtime = HeteroRuntime(HeteroConfig.from_flat(**flat), rank, world)

    def measure(batches, exchange):  # the probe: time the real model's forward + backward
        return probe_step_cost(net, lambda b: nn.functional.mse_loss(net(b[0]).squeeze(1), b[1]), batches,
                               steps=2, exchange=exchange)

    loader = runtime.train_loader(DataLoader(make_data(70), batch_size=8, shuffle=True), seed=0, measure=measure)
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp, max_steps=steps)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    seen = []
    while len(seen) < steps:
        for x, y in loader:
            runtime.batch_start()
            seen.append(len(x))
            nn.functional.mse_loss(ddp(x).squeeze(1), y).backward()
            runtime.backward_end()
            opt.step()
            opt.zero_grad()
            runtime.step_end()
            if len(seen) == steps:
                break
        loader.batch_sampler.set_epoch(loader.batch_sampler.epoch + 1)
    state = runtime.state_dict()
    # a new run builds its parts first (as an adapter does), then loads: the parts take the state
    fresh = HeteroRuntime(HeteroConfig.from_flat(**flat), rank, world)
    fresh.train_loader(DataLoader(make_data(70), batch_size=8, shuffle=True), seed=0, measure=measure)
    fresh.load_state_dict(state)
    summary = runtime.summary()
    return {"seen": seen, "weights": [p.detach().clone() for p in net.parameters()], "metrics": runtime.metrics(),
            "summary": summary,
            "state": state, "restored": fresh.state_dict(), "restored_epoch": fresh.sampler.epoch,
            "gathered": runtime.gathered_state_dict()}


@pytest.fixture(scope="module")
def explicit():
    return run_distributed(_train, 2, dict(batch_sizes=[3, 13]), 7, timeout=120)


def test_summary_counts_ring_bytes_and_the_split(explicit):
    params = sum(p.numel() for p in make_net().parameters())
    for rank in range(2):
        summary = explicit[rank]["summary"]
        # oracle: a ring all-reduce of fp32 on 2 ranks sends 2 (W-1)/W x 4 bytes per parameter
        assert summary["bytes_sent_per_step"] == [2 * 1 * 4 * params // 2] * 2
        assert summary["batch_sizes"] == [3, 13] and summary["window_steps"] == 7
        assert summary["samples_per_s"] == pytest.approx(16 / summary["step_s"])
    assert explicit[0]["summary"] == explicit[1]["summary"]  # one all-gather: the same figures everywhere


def test_summary_counts_bytes_when_buckets_wait_for_backward():
    deferred = run_distributed(_train, 2, dict(batch_sizes=[3, 13], overlap_comm=False), 3,
                               timeout=120)
    params = sum(p.numel() for p in make_net().parameters())
    assert deferred[0]["summary"]["bytes_sent_per_step"] == [4 * params] * 2  # 2 (W-1)/W x 4 bytes, W = 2


def test_summary_takes_medians_so_warm_up_does_not_count():
    from hetero_strategy.runtime import StepTimer

    timer = StepTimer()
    timer.history = [(5.0, 9.0), (0.2, 0.5), (0.4, 0.5), (0.3, 0.7)]  # a slow first step, then steady
    timer.bytes_history = [100, 10, 10, 30]
    timer.step_ends = [9.0, 9.6, 10.2, 10.9]  # wall time between ends: 0.6, 0.6, 0.7 (data loading included)
    got = timer.summary([6, 2])  # one process: its own figures
    assert got["step_s"] == pytest.approx(0.6) and got["samples_per_s"] == pytest.approx(8 / 0.6)
    assert got["bytes_sent_per_step"] == [20] and got["balance"] == 1.0 and got["window_steps"] == 4


def test_bare_ddp_equals_one_process(explicit):
    # 70 samples, G = 16: 4 full steps + 6 samples (1 and 5), then the next epoch.
    assert explicit[0]["seen"] == [3, 3, 3, 3, 1, 3, 3] and explicit[1]["seen"] == [13, 13, 13, 13, 5, 13, 13]
    oracle = one_process_sgd(make_data(70), 16, 7, shuffle=True)
    for rank in range(2):
        for got, want in zip(explicit[rank]["weights"], oracle.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def test_metrics_are_every_ranks(explicit):
    m = explicit[0]["metrics"]
    assert m == explicit[1]["metrics"]  # one all-gather: every rank sees the same figures
    assert (m["hetero/batch_size_r0"], m["hetero/batch_size_r1"]) == (3, 13)
    assert 0 <= m["hetero/balance"] <= 1 and m["hetero/compute_s_r1"] > 0


def test_state_round_trip_and_gather(explicit):
    for rank in range(2):
        saved, restored = explicit[rank]["state"], explicit[rank]["restored"]
        assert saved["steps"] == 7 and restored["steps"] == 7
        assert restored["sampler"] == saved["sampler"] and explicit[rank]["restored_epoch"] == saved["sampler"]["epoch"]
    # rank 0 holds every rank's state for the checkpoint it writes; the others hold no copies
    assert [r["steps"] for r in explicit[0]["gathered"]["ranks"]] == [7, 7]
    assert explicit[1]["gathered"]["ranks"] is None


def test_probe_plans_a_split_that_keeps_semantics():
    flat = dict(compression="topk", base_density=1.0, density_schedule="constant", dense_warmup_steps=1)
    out = run_distributed(_train, 2, flat, 5,
                          timeout=120)
    sizes = [out[0]["seen"][0], out[1]["seen"][0]]
    assert sum(sizes) == 16 and min(sizes) >= 1
    # Top-K at a constant density 1.0 is dense: the one-process trajectory, whatever split the probe chose.
    oracle = one_process_sgd(make_data(70), 16, 5, shuffle=True)
    for got, want in zip(out[0]["weights"], oracle.parameters()):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def test_a_full_checkpoint_resumed_on_another_world_size_keeps_the_data_position():
    """Lightning's full format / Accelerate's save_state: 2 ranks -> 3 ranks, as an elastic restart."""
    from torch.utils.data import DataLoader

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    data = DataLoader(make_data(96), batch_size=8)
    old = HeteroRuntime(HeteroConfig.from_flat(batch_sizes=[6, 10]), 0, 2)
    batches = iter(old.train_loader(data, seed=0))
    for _ in range(3):  # three steps of G = 16 trained: 48 samples of epoch 0
        next(batches)
        old.batch_start()
        old.step_end()
    saved = old.gathered_state_dict()
    warned: list[str] = []
    new = HeteroRuntime(HeteroConfig(), 0, 3, warn=warned.append)
    assert new.load_gathered_state_dict(saved) is False
    loader = new.train_loader(DataLoader(make_data(96), batch_size=5), seed=0)  # G = 15 on 3 ranks
    assert new.steps == 3 and new.sampler.position == (0, 45)  # 3 whole batches of 15: 3 samples repeat
    assert "checkpoint of 2 ranks resumed on 3" in warned[0]
    first = next(iter(loader))[1]
    assert torch.equal(first, make_data(96).tensors[1][45:45 + len(first)])  # goes on at sample 45


def test_a_checkpoint_resumed_with_another_batch_size_keeps_the_new_split_and_the_sample_position():
    """Same world, the loader's batch size changed (8 -> 12 per rank): the new split stands, with a
    warning, and the epoch goes on from the saved sample, rounded down to whole batches."""
    from torch.utils.data import DataLoader

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    old = HeteroRuntime(HeteroConfig.from_flat(capacities=[1.0, 3.0]), 0, 2)
    batches = iter(old.train_loader(DataLoader(make_data(96), batch_size=8), seed=0))
    for _ in range(3):  # three steps of G = 16: 48 samples of epoch 0
        next(batches)
        old.batch_start()
        old.step_end()
    warned: list[str] = []
    new = HeteroRuntime(HeteroConfig.from_flat(capacities=[1.0, 3.0]), 0, 2, warn=warned.append)
    new.load_state_dict(old.state_dict())  # this rank's part of a checkpoint of the same world
    loader = new.train_loader(DataLoader(make_data(96), batch_size=12), seed=0)  # G = 24
    assert new.sampler.batch_sizes == [6, 18] and new.sampler.position == (0, 48)  # 2 whole batches of 24
    assert "saved batch split is for another global batch" in warned[0]
    first = next(iter(loader))[1]
    assert torch.equal(first, make_data(96).tensors[1][48:48 + len(first)])  # rank 0 goes on at sample 48


def test_a_warning_every_rank_would_give_is_said_once_by_rank_0():
    """Issue 32: the plan's warnings follow from the config and the data, alike on every rank, so
    only rank 0 says them (here: accumulating with a partial last global batch)."""
    from torch.utils.data import DataLoader, TensorDataset

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    data = TensorDataset(torch.arange(100.0))  # G = 8 x 2 = 16 does not divide 100
    said: dict[int, list[str]] = {0: [], 1: []}
    for rank in (0, 1):  # no collective is needed with explicit batch sizes: each rank on its own
        runtime = HeteroRuntime(HeteroConfig.from_flat(batch_sizes=[6, 10]), rank, 2, info=lambda m: None,
                                warn=said[rank].append)
        runtime.train_loader(DataLoader(data, batch_size=8), seed=0, accumulate=2)
    assert len(said[0]) == 1 and "partial last batch" in said[0][0], said
    assert said[1] == []
