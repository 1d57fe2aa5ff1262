"""Periodic async checkpoints and elastic restart (runtime/checkpoint.py) on bare DDP.

The oracle of a resumed run is the same job run without a failure (tests/scripts/elastic_fit.py):
its final weights must be bitwise equal, and what a resume restores must equal what was saved.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from dist_utils import elastic_torchrun, launch_env, run_command
from oracle import make_data, make_net
from torch.utils.data import DataLoader

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.runtime import HeteroRuntime
from hetero_strategy.runtime.checkpoint import Checkpointer

SCRIPT = Path(__file__).parent / "scripts" / "elastic_fit.py"


def _torchrun(out: Path, *args: str, ranks: int = 2, restarts: int = 0) -> str:
    return elastic_torchrun(SCRIPT, out, *args, ranks=ranks, restarts=restarts)


def _weights(run: Path, rank: int) -> list[torch.Tensor]:
    return torch.load(run / f"final_rank{rank}.pt")["weights"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    _torchrun(out)
    return out


def _assert_same_weights(a: Path, b: Path) -> None:
    for rank in (0, 1):
        for x, y in zip(_weights(a, rank), _weights(b, rank), strict=True):
            assert torch.equal(x, y), (rank, (x - y).abs().max())


def test_a_rank_killed_mid_epoch_restarts_and_ends_with_the_uninterrupted_weights(uninterrupted, tmp_path):
    log = _torchrun(tmp_path, "--kill-rank", "1", "--kill-after", "10", restarts=2)
    assert "exitcode: -9" in log.replace("  ", " ") or "exitcode  : -9" in log  # rank 1 really died
    _assert_same_weights(uninterrupted, tmp_path)
    for rank in (0, 1):
        resumed = torch.load(tmp_path / f"resumed_rank{rank}.pt")
        saved = torch.load(tmp_path / f"saved_8_rank{rank}.pt")["state"]
        assert (resumed["steps"], resumed["epoch"], resumed["position"]) == (8, 1, (1, 32))  # 8 steps of 6/epoch
        assert resumed["state"]["sampler"] == saved["sampler"]  # the split schedule, with the re-split at 5
        assert resumed["state"]["sampler"]["splits"] == [[6, 10], [10, 6]]
        got, want = resumed["state"]["hook"]["residuals"], saved["hook"]["residuals"]
        assert want and got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want) and any(want[k].abs().sum() > 0 for k in want)


def test_a_crash_inside_a_checkpoint_write_resumes_from_the_one_before(uninterrupted, tmp_path):
    _torchrun(tmp_path, "--crash-in-write", "8", restarts=1)
    for rank in (0, 1):
        assert torch.load(tmp_path / f"resumed_rank{rank}.pt")["steps"] == 4  # step 8's write never completed
    _assert_same_weights(uninterrupted, tmp_path)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000012", "step_00000016"]


def test_another_world_size_replans_and_drops_the_residuals_with_their_count(uninterrupted, tmp_path):
    shutil.copytree(uninterrupted / "ckpt", tmp_path / "ckpt")
    log = _torchrun(tmp_path, "--steps", "19", ranks=3)
    saved = [torch.load(uninterrupted / f"saved_16_rank{r}.pt")["state"]["hook"]["residuals"] for r in (0, 1)]
    values = sum(t.numel() for res in saved for t in res.values())
    assert "checkpoint of 2 ranks resumed on 3" in log and f"({values} values" in log, log[-3000:]
    for rank in range(3):
        resumed = torch.load(tmp_path / f"resumed_rank{rank}.pt")
        # 16 steps of G=16 = 2 epochs of 96 and 64 samples; G=15 goes on after 4 whole batches (60)
        assert (resumed["steps"], resumed["epoch"], resumed["position"]) == (16, 2, (2, 60))
        assert resumed["state"]["hook"]["residuals"] == {}
        assert resumed["saved_world"] == 2 and resumed["split"] == [4, 5, 6]  # the new world's plan
    ref = torch.load(uninterrupted / "final_rank0.pt")["weights"]
    for x, y in zip(ref, torch.load(tmp_path / "resumed_rank2.pt")["weights"], strict=True):
        assert torch.equal(x, y)  # a new rank starts from the saved model


@pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root (namespaces, tc, cgroups)")
def test_emulate_max_restarts_resumes_a_killed_rank_on_the_emulated_cluster(uninterrupted, tmp_path):
    cmd = [sys.executable, "-m", "hetero_strategy.cli", "emulate", "--no-measure", "--compute", "1.0,1.0",
           "--max-restarts", "2", "--timeout", "200", "--", sys.executable, str(SCRIPT), str(tmp_path),
           "--kill-rank", "1", "--kill-after", "10"]
    rc, log = run_command(cmd, env=launch_env(), timeout=240)
    assert rc == 0, log[-4000:]
    assert "restarting every rank (restart 1 of 2)" in log and "after 1 restart(s)" in log
    assert torch.load(tmp_path / "resumed_rank1.pt")["steps"] == 8
    _assert_same_weights(uninterrupted, tmp_path)


# ---- one process: the files themselves ------------------------------------------------------
def _one_process(tmp_path: Path, **kw):
    config = HeteroConfig.from_flat(batch_sizes=[8], checkpoint_dir=str(tmp_path / "ckpt"), **kw)
    runtime = HeteroRuntime(config, 0, 1)
    loader = runtime.train_loader(DataLoader(make_data(32), batch_size=8, shuffle=True), seed=0)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return runtime, loader, net, opt


def _train(runtime, loader, net, opt, ckpt, steps: int) -> None:
    for _, (x, y) in zip(range(steps), loader):
        runtime.batch_start()
        torch.nn.functional.mse_loss(net(x).squeeze(1), y).backward()
        opt.step()
        opt.zero_grad()
        runtime.step_end()
        ckpt.step_end(net, opt)


def test_keeps_the_newest_complete_checkpoints_and_removes_a_crashs_leftovers(tmp_path):
    (tmp_path / "ckpt" / "step_00000099.partial").mkdir(parents=True)
    runtime, loader, net, opt = _one_process(tmp_path, checkpoint_every_steps=1, keep_checkpoints=2,
                                             checkpoint_every_s=None)
    ckpt = Checkpointer(runtime)
    assert not (tmp_path / "ckpt" / "step_00000099.partial").exists()
    _train(runtime, loader, net, opt, ckpt, 4)
    ckpt.close()
    assert [p.name for p in ckpt.complete()] == ["step_00000003", "step_00000004"]


def test_a_resume_restores_the_model_optimizer_and_position_of_one_process(tmp_path):
    runtime, loader, net, opt = _one_process(tmp_path, checkpoint_every_steps=3, checkpoint_every_s=None)
    ckpt = Checkpointer(runtime)
    _train(runtime, loader, net, opt, ckpt, 3)
    ckpt.close()
    saved = [p.detach().clone() for p in net.parameters()]
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in net.parameters()]
    _train(runtime, loader, net, opt, ckpt, 1)  # moves on past the checkpoint
    runtime2, loader2, net2, opt2 = _one_process(tmp_path)
    resumed = Checkpointer(runtime2).resume(net2, opt2)
    assert (resumed.steps, resumed.epoch, runtime2.sampler.position) == (3, 0, (0, 24))
    assert all(torch.equal(a, b) for a, b in zip(saved, net2.parameters()))
    assert all(torch.equal(m, opt2.state[p]["momentum_buffer"]) for m, p in zip(momentum, net2.parameters()))
    first = next(iter(loader2))[1]  # the 4th batch of the shuffled epoch: samples 24..31 of its order
    order = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first, make_data(32).tensors[1][order[24:32]])


def test_time_based_saves(tmp_path):
    runtime, loader, net, opt = _one_process(tmp_path, checkpoint_every_s=1e-6)
    ckpt = Checkpointer(runtime)
    _train(runtime, loader, net, opt, ckpt, 2)
    ckpt.close()
    assert [p.name for p in ckpt.complete()] == ["step_00000001", "step_00000002"]


def test_damaged_or_foreign_checkpoints_are_refused_in_one_line(tmp_path):
    runtime, loader, net, opt = _one_process(tmp_path, checkpoint_every_steps=1, checkpoint_every_s=None)
    ckpt = Checkpointer(runtime)
    _train(runtime, loader, net, opt, ckpt, 1)
    ckpt.close()
    other, _, net2, opt2 = _one_process(tmp_path, compression="topk")
    with pytest.raises(ConfigError, match=r"compression='none' is invalid for this run's compression='topk'"):
        Checkpointer(other).resume(net2, opt2)
    data = next((tmp_path / "ckpt" / "step_00000001").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:40])  # cut off
    runtime3, _, net3, opt3 = _one_process(tmp_path)
    with pytest.raises(ConfigError, match=r"step_00000001' is invalid: it cannot be read .*Delete it") as e:
        Checkpointer(runtime3).resume(net3, opt3)
    assert "\n" not in str(e.value)


# ---- Accelerate: HeteroPlugin(checkpoint_dir=...) saves and resumes by itself ------------------
def _accelerate_fit(rank: int, world: int, ckpt_dir: str, stop_after: int | None) -> dict | None:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    acc = Accelerator(cpu=True)
    plugin = HeteroPlugin(batch_sizes=[6, 10], compression="topk", base_density=0.25, dense_warmup_steps=2,
                          dense_fallback=False, checkpoint_dir=ckpt_dir, checkpoint_every_steps=4,
                          checkpoint_every_s=None)
    net = make_net()
    # NOTE: no momentum: empty optimizer state, which torch's get_state_dict would fill by a hidden
    # optimizer.step() that the plugin counts as a training step
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, gamma=0.5)
    model, opt, sched, loader = plugin.prepare(acc, net, opt, sched,
                                               DataLoader(make_data(96), batch_size=8, shuffle=True), max_steps=8)
    resumed = None if plugin.resumed is None else (plugin.resumed.steps, plugin.resumed.epoch)
    while plugin.runtime.steps < 8:
        for x, y in loader:
            plugin.backward(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            if plugin.runtime.steps == stop_after:
                plugin.checkpoints.wait()  # the step-4 checkpoint is on disk; this job then dies
                return None
            if plugin.runtime.steps == 8:
                break
    plugin.close()
    return {"weights": [p.detach().clone() for p in net.parameters()], "lr": sched.get_last_lr(),
            "resumed": resumed, "steps": plugin.runtime.steps,
            "saved": sorted(p.name for p in Path(ckpt_dir).iterdir())}


def test_accelerate_plugin_checkpoints_periodically_and_resumes_exactly(tmp_path):
    from dist_utils import run_distributed

    whole = run_distributed(_accelerate_fit, 2, str(tmp_path / "whole"), None, timeout=180)
    run_distributed(_accelerate_fit, 2, str(tmp_path / "cut"), 6, timeout=180)
    resumed = run_distributed(_accelerate_fit, 2, str(tmp_path / "cut"), None, timeout=180)
    for a, b in zip(whole, resumed, strict=True):
        assert b["resumed"] == (4, 0) and a["resumed"] is None  # 4 of the 6 steps an epoch, from step 4
        assert a["steps"] == b["steps"] == 8 and a["saved"] == b["saved"] == ["step_00000004", "step_00000008"]
        assert a["lr"] == b["lr"] == [0.05 * 0.5 ** 2]  # the scheduler came back too
        assert all(torch.equal(x, y) for x, y in zip(a["weights"], b["weights"], strict=True))


def _scaled_fit(rank: int, world: int, ckpt_dir: str, steps: int) -> dict:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    acc = Accelerator(cpu=True)
    # NOTE: Accelerate builds a GradScaler for fp16 on GPUs only; a CPU one stands in, doubling
    # its scale after every step (growth_interval=1), so the scale counts the steps it saw
    acc.scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    plugin = HeteroPlugin(checkpoint_dir=ckpt_dir, checkpoint_every_steps=2, checkpoint_every_s=None)
    net = make_net()
    model, opt, loader = plugin.prepare(acc, net, torch.optim.SGD(net.parameters(), lr=0.01),
                                        DataLoader(make_data(64), batch_size=8))
    for x, y in loader:
        if plugin.runtime.steps == steps:
            break
        acc.backward(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
        opt.step()
        opt.zero_grad()
    plugin.close()
    return {"resumed": None if plugin.resumed is None else plugin.resumed.steps, "scale": acc.scaler.get_scale()}


def test_accelerate_grad_scaler_comes_back_with_the_checkpoint(tmp_path):
    from dist_utils import run_distributed

    first = run_distributed(_scaled_fit, 1, str(tmp_path), 2, timeout=120)[0]
    again = run_distributed(_scaled_fit, 1, str(tmp_path), 3, timeout=120)[0]
    assert (first["resumed"], first["scale"]) == (None, 4.0 * 2 ** 2)
    assert (again["resumed"], again["scale"]) == (2, 4.0 * 2 ** 3)  # 2 saved steps + 1 more, not 1 step from 4


def _time_based(rank: int, world: int, ckpt_dir: str) -> list[str]:
    import torch.distributed as dist
    from dist_utils import init_gloo
    from torch.nn.parallel import DistributedDataParallel

    init_gloo(rank, world)
    config = HeteroConfig.from_flat(batch_sizes=[3, 5], checkpoint_dir=ckpt_dir, checkpoint_every_s=1e-6)
    runtime = HeteroRuntime(config, rank, world)
    loader = runtime.train_loader(DataLoader(make_data(64), batch_size=4), seed=0)
    model = DistributedDataParallel(make_net())
    runtime.register_hook(model, max_steps=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(runtime)
    saved = []
    for x, y in loader:
        runtime.batch_start()
        torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
        opt.step()
        opt.zero_grad()
        runtime.step_end()
        if ckpt.step_end(model, opt):
            saved.append(runtime.steps)
    ckpt.close()
    runtime.close()
    dist.barrier()
    return saved


def test_time_based_saves_happen_at_the_same_steps_on_every_rank(tmp_path):
    from dist_utils import run_distributed

    saved = run_distributed(_time_based, 2, str(tmp_path / "ckpt"), timeout=120)
    assert saved[0] == saved[1] and len(saved[0]) >= 2, saved  # rank 0's clock, agreed two steps ahead
    assert saved[0][0] >= 2 and all(b - a >= 2 for a, b in zip(saved[0], saved[0][1:]))


def test_a_time_based_save_announced_for_a_point_every_rank_skips_lands_at_the_next():
    """Hybrid training never polls the syncs inside join(); a late rank is still an error."""
    import torch.distributed as dist

    from hetero_strategy.runtime.save_schedule import SaveSchedule

    store = dist.HashStore()
    rank0, rank1 = SaveSchedule(0, None, 1e-9, False), SaveSchedule(1, None, 1e-9, False)
    rank0._store = rank1._store = store  # the rendezvous store, by hand
    assert not rank1.due(5) and not rank0.due(5)  # rank 0 announces step 7
    assert not rank0.due(6) and not rank1.due(6)
    assert rank0.due(8) and rank1.due(8)  # both skipped point 7 (a join): both save at 8
    late = SaveSchedule(1, None, 1e-9, False)
    late._store, late._timed = store, 1  # rank 1's next save
    assert not late.due(11)  # asked at 11 before anyone announced it ...
    assert not rank0.due(9)  # ... rank 0 announces 11 only now
    with pytest.raises(RuntimeError, match="no longer agree"):
        late.due(12)
