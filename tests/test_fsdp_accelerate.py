"""HeteroPlugin on Accelerate's FSDP2 (2 gloo ranks under torchrun) against one process on the global batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from dist_utils import launch_env, run_command
from oracle import make_data, one_process_sgd

SCRIPT = Path(__file__).parent / "scripts" / "accel_fsdp.py"


def _launch(cmd: list[str], out: Path, env: dict, world: int = 2) -> list[dict]:
    code, log = run_command(cmd, env=env, timeout=240)
    assert code == 0, log[-6000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module", params=["torchrun", "accelerate_launch"])
def ranks(request, tmp_path_factory):
    """Under torchrun with fsdp_version=2 in code, and under `accelerate launch` with the FSDP2 file
    that `hetero-strategy config` writes for 2 GPUs (the plugin then reads it from the environment)."""
    out = tmp_path_factory.mktemp("accel_fsdp")
    env = launch_env()
    if request.param == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", env["MASTER_PORT"], str(SCRIPT), str(out)]
        return _launch(cmd, out, env)
    from hetero_strategy.cli import main as cli_main

    answers = out / "answers.yaml"
    answers.write_text("device: gpu\nnum_processes: 2\nparallelism: sharded\n")
    assert cli_main(["config", "--answers", str(answers), "--output-dir", str(out)]) == 0
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file", str(out / "accelerate.yaml"),
           "--main_process_port", env["MASTER_PORT"], str(SCRIPT), str(out)]
    return _launch(cmd, out, env)


def _close(got, want) -> None:
    for g, w in zip(got, want.parameters(), strict=True):
        torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=0)


def test_fsdp2_with_unequal_batches_equals_one_process(ranks):
    oracle = one_process_sgd(make_data(80), 8, 8)
    for r, size in zip(ranks, (3, 5)):
        assert r["plain"]["sharded"] == "DTensor"  # Accelerate's fully_shard really ran
        assert r["plain"]["seen"] == [size] * 8
        _close(r["plain"]["weights"], oracle)


def test_gradient_accumulation_keeps_its_meaning_on_top(ranks):
    oracle = one_process_sgd(make_data(80), 8, 4, accumulate=2)
    for r in ranks:
        _close(r["accumulate"]["weights"], oracle)


@pytest.mark.parametrize("name, accumulate", [("micro", 1), ("micro_accumulate", 2)])
def test_a_share_above_its_cap_runs_as_passes_and_stays_exact(ranks, name, accumulate):
    oracle = one_process_sgd(make_data(80), 8, 8 // accumulate, accumulate=accumulate)
    assert ranks[0][name]["seen"] == [3] * 8 and ranks[1][name]["seen"] == [2, 2, 1] * 8
    for r in ranks:
        _close(r[name]["weights"], oracle)


@pytest.mark.parametrize("name", ["resumed", "load_state"])
def test_a_stopped_run_resumes_with_its_sharded_momentum_and_equals_one_process(ranks, name):
    """4 steps, a stop, then 4 more from the checkpoint (HeteroPlugin's checkpoint_dir, or
    accelerator.save_state/load_state): one process's 8 steps of SGD with momentum."""
    oracle = one_process_sgd(make_data(80), 8, 8, momentum=0.9)
    for r, size in zip(ranks, (3, 5)):
        assert r[name]["start"] == 4 and r[name]["seen"] == [size] * 4  # steps 5..8 only
        _close(r[name]["weights"], oracle)


def test_a_loss_not_weighted_by_the_plugin_is_refused(ranks):
    for r in ranks:
        assert "call plugin.backward(loss) in place of accelerator.backward(loss)" in r["unweighted"]
        assert r["topk"].startswith("ConfigError: compression='topk' is invalid under FSDP2")


def test_the_plugin_runs_fsdp_version_2(ranks):
    assert all(r["fsdp_version"] == 2 for r in ranks)


def test_three_ranks_of_unequal_batches_equal_one_process(tmp_path):
    """2/3/4 of a global batch of 9 (DataLoader batch_size 3) on 3 ranks of Accelerate's FSDP2."""
    env = launch_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
           "--master-port", env["MASTER_PORT"], str(SCRIPT), str(tmp_path)]
    oracle = one_process_sgd(make_data(80), 9, 8)
    for r, size in zip(_launch(cmd, tmp_path, env, world=3), (2, 3, 4), strict=True):
        assert r["plain"]["sharded"] == "DTensor" and r["plain"]["seen"] == [size] * 8
        _close(r["plain"]["weights"], oracle)
