"""mode="hybrid" through HeteroPlugin (Accelerate) on 2 gloo ranks (Accelerator(cpu=True), MULTI_CPU).

The user's plain loop (``plugin.backward(loss); optimizer.step(); optimizer.zero_grad()``) plus
``plugin.evaluated(val_loss)`` after each epoch; checked against one-process momentum SGD (H = 1)
and, with a slow rank 1 and H = 4, for unequal local step counts that still end on one model.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from dist_utils import run_distributed
from oracle import make_data, make_net
from torch import nn
from torch.utils.data import DataLoader

LR, MOMENTUM = 0.05, 0.9


def _recording(controller) -> list[list[int]]:
    """Every sync's per-rank step counts (a wrapper, no change to the logic)."""
    records: list[list[int]] = []
    original = controller.sync

    def sync(joined: bool = False) -> bool:
        done = original(joined)
        records.append(list(controller.last["steps"]))
        return done

    controller.sync = sync
    return records


def _fit(rank: int, world: int, plugin_kw: dict, epochs: int, val: list[float], sleep_s: float) -> dict:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2 and str(accelerator.distributed_type) == "DistributedType.MULTI_CPU"
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    plugin = HeteroPlugin(mode="hybrid", **plugin_kw)
    model, opt, loader = plugin.prepare(accelerator, net, opt, DataLoader(make_data(64), batch_size=4))
    syncs = _recording(plugin.runtime.hybrid.controller)
    steps, phases, switched = 0, [], []
    for epoch in range(epochs):
        phases.append(plugin.runtime.hybrid.schedule.phase)
        for x, y in loader:  # the user's loop, nothing hybrid in it
            loss = nn.functional.mse_loss(model(x).squeeze(1), y)
            plugin.backward(loss)
            opt.step()
            opt.zero_grad()
            steps += 1
            if rank == 1:
                time.sleep(sleep_s)  # the slow device
        sign = 1 if rank == 0 else -1
        switched.append(plugin.evaluated(val[epoch] + sign * 0.1 * epoch))  # only the mean decides
    plugin.close()
    return {"weights": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()],
            "syncs": syncs, "phases": phases, "switched": switched, "steps": steps}


def test_h1_through_accelerate_equals_one_process_momentum_sgd():
    # flat losses: the switch to synchronous DDP at the 2nd evaluation (N = 1), optimizer state averaged
    kw = dict(periods=[1, 1], plateau_thresholds=[0.5], plateau_evals=1, local_clip_norm=None, batch_sizes=[3, 5])
    out = run_distributed(_fit, 2, kw, 3, [1.0, 1.0, 1.0], 0.0, timeout=90)
    assert out[0]["switched"] == [False, True, False] and out[0]["phases"] == [0, 0, 1]
    assert all(s == [1, 1] for s in out[0]["syncs"] if min(s) > 0)  # H = 1: one sync per step
    net = make_net()  # the oracle: one process, batch G = 8 in order, momentum SGD
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = make_data(64).tensors
    for s in range(24):
        idx = slice((8 * s) % 64, (8 * s) % 64 + 8)
        opt.zero_grad()
        nn.functional.mse_loss(net(x[idx]).squeeze(1), y[idx]).backward()
        opt.step()
    for rank in range(2):
        assert out[rank]["steps"] == 24
        for got, want in zip(out[rank]["weights"], net.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(out[0]["weights"], out[1]["weights"], strict=True):
        assert torch.equal(a, b)


def test_unequal_speeds_through_accelerate_end_on_one_model():
    kw = dict(periods=[4, 1], plateau_thresholds=[0.05], plateau_evals=1, max_staleness=3, batch_sizes=[4, 4])
    out = run_distributed(_fit, 2, kw, 2, [1.0, 0.5], 0.02, timeout=90)
    assert out[0]["switched"] == [False, False] and out[0]["phases"] == [0, 0]  # 50%: no plateau, local throughout
    steps = out[0]["syncs"]
    assert steps == out[1]["syncs"]
    assert any(s[0] > s[1] > 0 for s in steps), steps  # the fast rank took more local steps in a period
    assert any(s[0] == 0 and s[1] > 0 for s in steps), steps  # ... ran out first and waited in join
    assert sum(s[0] for s in steps) == sum(s[1] for s in steps) == 16  # every batch in some sync
    for a, b in zip(out[0]["weights"], out[1]["weights"], strict=True):
        assert torch.equal(a, b)


def test_evaluated_and_join_need_prepare():
    from hetero_strategy.accelerate import HeteroPlugin

    plugin = HeteroPlugin(mode="hybrid")
    with pytest.raises(RuntimeError, match="HeteroPlugin.join needs prepare"):
        plugin.evaluated(1.0)


# ---- checkpoint_dir: saved at synced points, resumed exactly ----------------------------------
def _ckpt_fit(rank: int, world: int, directory: str, stop_after: int | None) -> dict | None:
    import torch.distributed as dist
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    accelerator = Accelerator(cpu=True)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    plugin = HeteroPlugin(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], batch_sizes=[3, 5],
                          checkpoint_dir=directory, checkpoint_every_steps=2, checkpoint_every_s=None)
    model, opt, loader = plugin.prepare(accelerator, net, opt, DataLoader(make_data(64), batch_size=4))
    resumed = None if plugin.resumed is None else (plugin.resumed.steps, plugin.resumed.epoch)
    while plugin.runtime.steps < 16:
        for x, y in loader:
            plugin.backward(nn.functional.mse_loss(model(x).squeeze(1), y))
            opt.step()
            opt.zero_grad()
            # NOTE: lockstep, so every run has the same sync points (the store protocol's timing is free)
            dist.barrier()
            if plugin.runtime.steps == stop_after:
                plugin.checkpoints.wait()  # the checkpoint saved at this batch's start is on disk; the job dies
                return None
            if plugin.runtime.steps == 16:
                break
    plugin.close()
    return {"weights": [p.detach().clone() for p in net.parameters()], "resumed": resumed,
            "momentum": [opt.optimizer.state[p]["momentum_buffer"].clone() for p in net.parameters()],
            "saved": sorted(p.name for p in Path(directory).iterdir())}


def test_checkpoint_dir_saves_at_synced_points_and_resumes_exactly(tmp_path):
    whole = run_distributed(_ckpt_fit, 2, str(tmp_path / "whole"), None, timeout=90)
    run_distributed(_ckpt_fit, 2, str(tmp_path / "cut"), 13, timeout=90)
    resumed = run_distributed(_ckpt_fit, 2, str(tmp_path / "cut"), None, timeout=90)
    # synced points (H = 4, 8 steps an epoch): steps 4, 8, the join, 12, 16; due at every 2nd,
    # saved when the next batch starts and named by the count then: 3 (after the join), 4
    assert whole[0]["saved"][:2] == ["step_00000003", "step_00000004"]
    assert any(not torch.equal(a, b) for a, b in zip(whole[0]["momentum"], whole[1]["momentum"], strict=True))
    for rank in range(2):
        assert resumed[rank]["resumed"] == (12, 1)
        for got, want in zip(resumed[rank]["weights"], whole[rank]["weights"], strict=True):
            assert torch.equal(got, want), (rank, (got - want).abs().max())
        for got, want in zip(resumed[rank]["momentum"], whole[rank]["momentum"], strict=True):
            assert torch.equal(got, want)


def _save_mid_period(rank: int, world: int, directory: str) -> str:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    accelerator = Accelerator(cpu=True)
    net = make_net()
    plugin = HeteroPlugin(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], batch_sizes=[4, 4])
    model, opt, loader = plugin.prepare(accelerator, net, torch.optim.SGD(net.parameters(), lr=LR),
                                        DataLoader(make_data(64), batch_size=4))
    x, y = next(iter(loader))
    plugin.backward(nn.functional.mse_loss(model(x).squeeze(1), y))
    opt.step()
    opt.zero_grad()
    assert not plugin.runtime.synced  # 1 of H = 4 local steps on either rank
    try:
        accelerator.save_state(directory)
        said = ""
    except RuntimeError as e:
        said = str(e)
    # NOTE: both ranks past their step's store update before rank 0 (the store's host) exits
    torch.distributed.barrier()
    return said


def test_save_state_inside_a_period_is_refused_before_anything_is_written(tmp_path):
    out = run_distributed(_save_mid_period, 2, str(tmp_path / "state"), timeout=60)
    for message in out:  # every rank refuses alike
        assert message.startswith("hetero: accelerator.save_state inside a local-SGD period"), message
        assert "runtime.synced" in message
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


def _one_process(rank: int, world: int) -> dict:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    accelerator = Accelerator(cpu=True)
    net = make_net()
    plugin = HeteroPlugin(mode="hybrid", periods=[2, 1], plateau_thresholds=[0.05], local_clip_norm=None)
    model, opt, loader = plugin.prepare(accelerator, net, torch.optim.SGD(net.parameters(), lr=LR),
                                        DataLoader(make_data(64), batch_size=8))
    for x, y in loader:
        plugin.backward(nn.functional.mse_loss(model(x).squeeze(1), y))
        opt.step()
        opt.zero_grad()
    plugin.evaluated(1.0)
    plugin.close()
    return {"world": accelerator.num_processes, "syncs": plugin.runtime.hybrid.controller.syncs, "plain": model is net,
            "weights": [p.detach().clone() for p in net.parameters()]}


def test_one_process_runs_hybrid_as_plain_sgd():
    from accelerate.state import AcceleratorState

    try:  # in this process: no launcher environment, so Accelerate hands back the plain module
        out = _one_process(0, 1)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert out["world"] == 1 and out["syncs"] == 4 and out["plain"]  # H = 2 over 8 steps
    oracle = make_net()  # averaging over one rank changes nothing: plain SGD
    opt = torch.optim.SGD(oracle.parameters(), lr=LR)
    x, y = make_data(64).tensors
    for s in range(8):
        opt.zero_grad()
        nn.functional.mse_loss(oracle(x[8 * s:8 * s + 8]).squeeze(1), y[8 * s:8 * s + 8]).backward()
        opt.step()
    for got, want in zip(out["weights"], oracle.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def _fused_prepare(rank: int, world: int, clip: float | None, scaled: tuple[int, ...] = (0, 1)) -> str | None:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin
    from hetero_strategy.config import ConfigError

    accelerator = Accelerator(cpu=True)
    if rank in scaled:
        accelerator.scaler = torch.amp.GradScaler("cpu")  # Accelerate's fp16 scaler (built on GPUs only)
    plugin = HeteroPlugin(mode="hybrid", local_clip_norm=clip)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, fused=True)
    try:
        plugin.prepare(accelerator, net, opt, DataLoader(make_data(16), batch_size=4))
    except ConfigError as e:
        # refused before any work: nothing hooked into the user's optimizer, the plugin unused
        assert not opt._optimizer_step_post_hooks and plugin.runtime is None
        return str(e)
    finally:
        plugin.close()
    return None


def test_local_clipping_beside_a_fused_fp16_optimizer_is_refused_at_prepare():
    for message in run_distributed(_fused_prepare, 2, 1.0, timeout=60):
        assert message.startswith("local_clip_norm=1.0 is invalid with SGD(fused=True) under fp16")
    assert run_distributed(_fused_prepare, 2, None, timeout=60) == [None, None]  # the fix it names


def test_local_clipping_refusal_stops_every_rank_when_only_one_scales():
    """Per-machine settings: fp16 on rank 1 only. Rank 0 alone sees nothing wrong, yet it must stop
    too, with the rank named, instead of hanging at its next collective."""
    for message in run_distributed(_fused_prepare, 2, 1.0, (1,), timeout=60):
        assert message.startswith("local_clip_norm=1.0 is invalid with ") and "on rank(s) [1]" in message
