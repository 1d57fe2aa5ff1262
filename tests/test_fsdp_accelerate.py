"""HeteroPlugin on Accelerate's FSDP2 (2 gloo ranks under torchrun) against one process on the global batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from dist_utils import launch_env, run_command
from oracle import make_data, one_process_sgd

SCRIPT = Path(__file__).parent / "scripts" / "accel_fsdp.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("accel_fsdp")
    env = launch_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", env["MASTER_PORT"], str(SCRIPT), str(out)]
    code, log = run_command(cmd, env=env, timeout=240)
    assert code == 0, log[-6000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


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


def test_a_loss_not_weighted_by_the_plugin_is_refused(ranks):
    for r in ranks:
        assert "call plugin.backward(loss) in place of accelerator.backward(loss)" in r["unweighted"]
        assert r["topk"].startswith("ConfigError: compression='topk' is invalid under FSDP2")
