"""Lightning Fabric: ``Fabric(strategy="hetero")`` follows one process, resumes bitwise, refuses bad keywords.

Two CPU gloo ranks with batch sizes 3 and 13 (B = 8, G = 16); the oracle is the plain one-process loop
of tests/oracle.py, shuffled as one DataLoader would be (semantics 1-3). Resume: a run killed with
SIGKILL after the checkpoint of step 5 of 8 goes on from that fabric.save file and must end bitwise
where the uninterrupted run ends, Top-K residuals, momentum and the calibrator's rows included.
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from oracle import make_data, make_net, one_process_sgd

N, B, STEPS = 120, 8, 8  # 120 samples at G = 16: seven full steps and a short eighth (8 samples)
TOPK = dict(compression="topk", base_density=0.25, dense_warmup_steps=1, dense_fallback=False)  # residuals from step 1


def _fabric(**hetero):
    from lightning.fabric import Fabric

    from hetero_strategy import HeteroFabricStrategy

    fabric = Fabric(strategy=HeteroFabricStrategy(**hetero), accelerator="cpu", devices=2)
    fabric.launch()
    return fabric


def _loop(fabric, loader, model, optimizer, state, save_dir=None, kill_after=None):
    """The user's Fabric loop: the batch sizes each rank saw, a checkpoint after every step."""
    import os
    import signal

    seen = []
    for x, y in loader:
        seen.append(len(x))
        fabric.backward(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
        optimizer.step()
        optimizer.zero_grad()
        state["step"] += 1
        if save_dir is not None:
            fabric.save(f"{save_dir}/step{state['step']}.ckpt", state)
        if state["step"] == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # fabric.save ended with a barrier: no peer waits on us
    return seen


def _run(hetero, *, momentum=0.0, save_dir=None, kill_after=None, resume_from=None):
    from torch.utils.data import DataLoader

    fabric = _fabric(**hetero)
    model = make_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(make_data(N), batch_size=B, shuffle=True))
    state = {"model": model, "optimizer": optimizer, "step": 0}
    if resume_from is not None:
        fabric.load(resume_from, state)
    seen = _loop(fabric, loader, model, optimizer, state, save_dir, kill_after)
    out = {"seen": seen, "steps": state["step"], "weights": [p.detach().clone() for p in model.parameters()],
           "optim": optimizer.state_dict(), "hetero": fabric.strategy.runtime.state_dict(), "fabric": fabric}
    return out


def _exact(rank, world_size):
    from torch.utils.data import DataLoader, DistributedSampler

    out = _run({"batch_sizes": [3, 13]})
    fabric = out.pop("fabric")
    val = fabric.setup_dataloaders(DataLoader(make_data(20), batch_size=4))  # after the training loader
    out["val_sampler"] = type(val.sampler).__name__
    out["val_samples"] = len(val.sampler) if isinstance(val.sampler, DistributedSampler) else None
    out["ddp_hook"] = type(fabric.strategy.hook_state).__name__
    out["metrics"] = fabric.strategy.metrics()  # collective, on both ranks here
    fabric.strategy.teardown()
    probed = _fabric(probe_steps=1)  # no sizes: the start-up probe times the model on every rank
    net = make_net()
    probed.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    probed.setup_dataloaders(DataLoader(make_data(N), batch_size=B, shuffle=True))
    out["probed_sizes"] = list(probed.strategy.sampler.batch_sizes)
    probed.strategy.teardown()
    out["accumulated"] = _accumulate()
    return out


def _accumulate():
    """Two micro-batches per optimizer step through fabric.no_backward_sync, as Fabric's docs loop it."""
    from torch.utils.data import DataLoader

    fabric = _fabric(batch_sizes=[3, 13])
    net = make_net()
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    loader = fabric.setup_dataloaders(DataLoader(make_data(128), batch_size=B, shuffle=True))  # 8 full batches
    for i, (x, y) in enumerate(loader):
        with fabric.no_backward_sync(model, enabled=i % 2 == 0):
            fabric.backward(torch.nn.functional.mse_loss(model(x).squeeze(1), y) / 2)
        if i % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()
    fabric.strategy.teardown()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def exact():
    return run_distributed(_exact, 2, timeout=240)


def test_a_whole_epoch_equals_one_process(exact):
    oracle = one_process_sgd(make_data(N), B * 2, STEPS, shuffle=True)
    errors = [(got - want.detach()).abs().max().item() for rank in range(2)
              for got, want in zip(exact[rank]["weights"], oracle.parameters(), strict=True)]
    print(f"fabric 3/13 vs one process after {STEPS} steps: max abs error {max(errors):.3g}")  # for the notes (-s)
    assert max(errors) <= 1e-5, errors
    for a, b in zip(exact[0]["weights"], exact[1]["weights"], strict=True):
        assert torch.equal(a, b)  # ranks identical


def test_gradient_accumulation_through_no_backward_sync_equals_one_process(exact):
    oracle = one_process_sgd(make_data(128), B * 2, STEPS // 2, shuffle=True, accumulate=2)
    for rank in range(2):
        for got, want in zip(exact[rank]["accumulated"], oracle.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def test_each_rank_takes_its_share_of_every_global_batch(exact):
    assert exact[0]["seen"][:7] == [3] * 7 and exact[1]["seen"][:7] == [13] * 7
    assert exact[0]["seen"][7] + exact[1]["seen"][7] == N - 7 * 2 * B  # the short last batch, split 3:13
    assert exact[0]["ddp_hook"] == "WeightedReduceState"
    for rank in range(2):  # the last step was the short one: 8 samples split 3:13
        metrics = exact[rank]["metrics"]
        assert [metrics["hetero/batch_size_r0"], metrics["hetero/batch_size_r1"]] == [exact[0]["seen"][7],
                                                                                      exact[1]["seen"][7]]
        assert 0 <= metrics["hetero/balance"] <= 1


def test_later_loaders_keep_fabrics_distributed_sampler(exact):
    assert exact[0]["val_sampler"] == "DistributedSampler"
    assert exact[0]["val_samples"] == 10  # 20 samples over 2 ranks


def test_without_sizes_the_probe_plans_the_split_alike_on_every_rank(exact):
    sizes = exact[0]["probed_sizes"]
    assert sizes == exact[1]["probed_sizes"] and sum(sizes) == 2 * B and min(sizes) >= 1


def _resume(rank, world_size, save_dir, phase):
    # the calibrator keeps each step's row from step 2 on (its first decision would come at step 51)
    hetero = {"batch_sizes": [3, 13], "calibrate": True, "cold_start_steps": 2, **TOPK}
    if phase == "whole":
        out = _run(hetero, momentum=0.9)
    elif phase == "killed":
        _run(hetero, momentum=0.9, save_dir=save_dir, kill_after=5)
        raise AssertionError("the run was to be killed after step 5")
    else:
        out = _run(hetero, momentum=0.9, resume_from=f"{save_dir}/step5.ckpt")
    out["fabric"].strategy.teardown()
    del out["fabric"]
    return out


def test_killed_after_step_5_and_resumed_ends_bitwise_equal(tmp_path):
    whole = run_distributed(_resume, 2, str(tmp_path), "whole", timeout=240)
    killed = run_distributed(_resume, 2, str(tmp_path), "killed", timeout=240, may_die=(0, 1))
    assert killed == [None, None] and (tmp_path / "step5.ckpt").is_file()
    resumed = run_distributed(_resume, 2, str(tmp_path), "resumed", timeout=240)
    for rank in range(2):
        assert resumed[rank]["steps"] == whole[rank]["steps"] == STEPS
        assert resumed[rank]["seen"] == whole[rank]["seen"][5:]  # the sampler went on from step 5
        for a, b in zip(resumed[rank]["weights"], whole[rank]["weights"], strict=True):
            assert torch.equal(a, b)
        for key, momentum in whole[rank]["optim"]["state"].items():
            assert torch.equal(resumed[rank]["optim"]["state"][key]["momentum_buffer"], momentum["momentum_buffer"])
        want, got = whole[rank]["hetero"]["hook"], resumed[rank]["hetero"]["hook"]
        assert got["step"] == want["step"]
        assert sorted(got["residuals"]) == sorted(want["residuals"]) and want["residuals"]
        for key, residual in want["residuals"].items():
            assert torch.equal(got["residuals"][key], residual)
        rows = [[row[0] for row in r["hetero"]["balancer"]["pending"]] for r in (whole[rank], resumed[rank])]
        assert rows[0] == list(range(2, STEPS)) and rows[1] == rows[0]  # 2-4 from the checkpoint, 5-7 after it


def _precision(rank, world_size):
    out = _run({"batch_sizes": [3, 13], "precision_policy": ["fp16", "fp32"], "init_scale": 256.0})
    fabric = out.pop("fabric")
    rp = fabric.strategy.runtime.precision
    out.update(dtype=rp.dtype, history=list(rp.scaler.history))
    fabric.strategy.teardown()
    tiered = _run({"batch_sizes": [3, 13], "compression": "tiered", "tiers": ["ib", "eth1g"], "dense_fallback": False})
    state = tiered.pop("fabric").strategy.hook_state
    out["tiered"] = {"tiers": list(state.tiers), "weights": tiered["weights"], "bytes": state.total_bytes_sent}
    return out


@pytest.fixture(scope="module")
def precision_runs():
    return run_distributed(_precision, 2, timeout=240)


def test_precision_policy_fp16_beside_fp32_keeps_ranks_in_sync(precision_runs):
    ranks = precision_runs
    assert [r["dtype"] for r in ranks] == ["fp16", "fp32"]
    # every step went through the coordinated step; only the fp16 rank scales its loss (no overflow at 256)
    assert ranks[0]["history"] == [256.0] * STEPS and ranks[1]["history"] == [1.0] * STEPS
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True):
        assert torch.equal(a, b)
    oracle = one_process_sgd(make_data(N), B * 2, STEPS, shuffle=True)
    for got, want in zip(ranks[0]["weights"], oracle.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=2e-2, atol=2e-2)


def test_tiered_compression_rides_on_the_fabric_ddp_module(precision_runs):
    ranks = [r["tiered"] for r in precision_runs]
    assert ranks[0]["tiers"] == ranks[1]["tiers"] == ["ib", "eth1g"]
    assert ranks[0]["bytes"] > 0
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True):
        assert torch.equal(a, b)


STALL_S = 2.0


def _stall(rank, world_size):
    import os
    import signal
    import time

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from hetero_strategy.runtime import StallError

    fabric = _fabric(batch_sizes=[3, 13], stall_timeout_s=STALL_S)
    pids = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    net = make_net()
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    loader = fabric.setup_dataloaders(DataLoader(make_data(N), batch_size=B))
    out = {}
    try:
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            if rank == 1 and step == 2:
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen for good: rank 0 kills it below
            started = time.monotonic()
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    except StallError as e:
        out.update(error=str(e), waited=time.monotonic() - started)
    os.kill(pids[1], signal.SIGKILL)  # no process left behind
    fabric.strategy.teardown()
    return out


def test_a_frozen_peer_in_backward_is_a_stall_error_within_the_bound():
    survivor, _ = run_distributed(_stall, 2, timeout=120, may_die=(1,))
    assert "rank 1" in survivor["error"] and "exchange of step 2" in survivor["error"], survivor["error"]
    assert survivor["waited"] < STALL_S + 10, survivor


@pytest.mark.parametrize(("keywords", "words"), [
    ({"batch_sizes": [3, 0]}, "batch_sizes"),
    ({"bogus": 1}, "bogus=1"),
    ({"compression": "zip"}, "compression"),
    ({"mode": "hybrid"}, "mode='hybrid'"),
    ({"max_batch_sizes": [4, 16]}, "max_batch_sizes"),
    ({"checkpoint_dir": "ckpt"}, "checkpoint_dir"),
    ({"loss_fn": 3}, "loss_fn=3"),
    ({"max_steps": 0}, "max_steps=0"),
    ({"precision_policy": "auto", "precision": object()}, "precision_policy='auto'"),
])
def test_bad_keywords_are_refused_at_construction(keywords, words):
    from hetero_strategy import ConfigError, HeteroFabricStrategy

    with pytest.raises(ConfigError, match="invalid") as error:
        HeteroFabricStrategy(**keywords)
    assert words in str(error.value)



def test_a_resume_in_a_later_epoch_goes_on_from_that_epoch():
    """Fabric sets the sampler's epoch to its own count of iterations (0 in a restarted process);
    the restored position's epoch wins, so epoch 1 is not replaced by a replay of epoch 0."""
    from lightning.fabric.utilities.data import _set_sampler_epoch
    from torch.utils.data import DataLoader

    from hetero_strategy.balance import HeteroBatchSampler
    from hetero_strategy.runtime.loaders import claiming_loader

    data, steps = make_data(N), -(-N // (2 * B))  # 8 steps per epoch
    trained = HeteroBatchSampler(N, [3, 13], 1, shuffle=True, seed=0)
    trained.set_epoch(1)
    trained.resume_at(steps + 2)  # epoch 1, two steps trained
    sampler = HeteroBatchSampler(N, [3, 13], 1, shuffle=True, seed=0)
    sampler.load_state_dict(trained.state_dict())
    claimed = []
    loader = claiming_loader(DataLoader(data, batch_sampler=sampler), lambda: claimed.append(1))
    for epoch in range(2):  # what _FabricDataLoader.__iter__ does before each pass
        _set_sampler_epoch(loader, epoch)
        first = next(iter(loader))
        order = torch.randperm(N, generator=torch.Generator().manual_seed(1 + epoch))
        start = 2 * 2 * B if epoch == 0 else 0  # epoch 1 resumes at step 2; epoch 2 starts afresh
        torch.testing.assert_close(first[0], data.tensors[0][order[start + 3:start + 16]], rtol=0, atol=0)
    assert len(claimed) == 2
