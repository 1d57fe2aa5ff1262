"""The four recipes' offline defaults on 2 CPU ranks, launched the way their docstrings say.

Lightning recipes run through their LightningCLI (Lightning starts the second rank itself);
Accelerate recipes through ``accelerate launch``. NOTE: ``accelerate launch --cpu
--num_processes 2`` starts one process on this Accelerate, so the ``ACCELERATE_USE_CPU=true
... --multi_gpu`` form is used, which starts two MULTI_CPU gloo ranks.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest
from dist_utils import launch_env, run_command

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _lightning(script: str, tmp_path: Path, *args: str, torchrun: bool = False) -> str:
    """The script as its docstring launches it: ``python`` (Lightning starts rank 1) or ``torchrun``."""
    env = launch_env()
    launcher = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", env["MASTER_PORT"]] if torchrun else [sys.executable]
    rc, log = run_command([*launcher, str(RECIPES / script), "--trainer.accelerator=cpu", "--trainer.devices=2",
                           "--trainer.limit_val_batches=1", *args], env=env, cwd=tmp_path, timeout=240)
    assert rc == 0, log[-6000:]
    return log


def _accelerate(script: str, tmp_path: Path, *args: str) -> str:
    env = dict(launch_env(), ACCELERATE_USE_CPU="true")
    rc, log = run_command([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
                           "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                           env["MASTER_PORT"], str(RECIPES / script), "--eval-batches", "1", *args],
                          env=env, cwd=tmp_path, timeout=240)
    assert rc == 0, log[-6000:]
    return log


def _figures(log: str, steps: int) -> dict:
    """The batch split and per-rank MB per step the recipe printed, checked for its final table."""
    split = re.search(r"global batch (\d+) split as \[(\d+), (\d+)\]", log)
    assert split, log[-4000:]
    assert f"final figures after {steps} optimizer steps" in log, log[-4000:]
    accuracy = re.search(rf"^RESULT accuracy=([\d.]+) steps={steps}$", log, re.MULTILINE)
    assert accuracy, log[-4000:]
    mb = [float(x) for x in re.findall(r"r\d: ([\d.]+) MB", log)]
    assert len(mb) == 2, log[-4000:]
    g, b0, b1 = map(int, split.groups())
    assert b0 + b1 == g and f"{b0} + {b1} = {g}" in log
    return {"split": [b0, b1], "mb": mb, "accuracy": float(accuracy.group(1))}


def _dense_ring_mb(params: int) -> float:
    """Oracle: a ring all-reduce of fp32 gradients on 2 ranks sends 2 (W-1)/W x 4 bytes per parameter."""
    return 2 * (2 - 1) / 2 * 4 * params / 1e6


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet_lightning_cli_with_fixed_split_logs_per_rank_metrics(tmp_path, monkeypatch):
    log = _lightning("resnet_lightning.py", tmp_path, "--trainer.max_steps=2", "--data.batch_size=8",
                     "--trainer.strategy=hetero_strategy.HeteroStrategy",
                     "--trainer.strategy.batch_sizes=[10, 6]", "--trainer.log_every_n_steps=1")
    fig = _figures(log, steps=2)
    assert fig["split"] == [10, 6]  # the user's split, not the probe's
    monkeypatch.syspath_prepend(str(RECIPES))
    from hetero_strategy.workloads.resnets import resnet_cifar_stem as resnet

    assert fig["mb"] == pytest.approx([_dense_ring_mb(_params(resnet("resnet18")))] * 2, abs=1e-3)
    # the CSV logger is on by default and holds every rank's figures
    (metrics,) = tmp_path.glob("logs/lightning_logs/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    logged = [r for r in rows if r.get("hetero/batch_size_r0")]
    assert logged, rows
    assert float(logged[0]["hetero/batch_size_r0"]) == 10 and float(logged[0]["hetero/batch_size_r1"]) == 6


def test_bert_lightning_cli_under_torchrun_yaml_mixed_precision_and_topk(tmp_path):
    log = _lightning("bert_lightning.py", tmp_path, "--config", str(RECIPES / "configs" / "offline_smoke.yaml"),
                     "--trainer.max_steps=6", "--trainer.strategy.precision_policy=[bf16, fp32]", torchrun=True)
    fig = _figures(log, steps=6)
    for rank, dtype in ((0, "bf16"), (1, "fp32")):  # each rank says its dtype
        assert f"rank {rank} autocasts in {dtype}" in log, log[-4000:]
    assert all(0 < mb for mb in fig["mb"])


def test_resnet_accelerate_with_a_hetero_yaml(tmp_path, monkeypatch):
    (tmp_path / "hetero.yaml").write_text("balance:\n  batch_sizes: [6, 10]\n")  # as the wizard writes it
    log = _accelerate("resnet_accelerate.py", tmp_path, "--steps", "2", "--batch-size", "8",
                      "--hetero-config", "hetero.yaml")
    fig = _figures(log, steps=2)
    assert fig["split"] == [6, 10]
    monkeypatch.syspath_prepend(str(RECIPES))
    from hetero_strategy.workloads.resnets import resnet_cifar_stem as resnet

    assert fig["mb"] == pytest.approx([_dense_ring_mb(_params(resnet("resnet18")))] * 2, abs=1e-3)


def test_bert_accelerate_tiered_mixed_precision(tmp_path):
    log = _accelerate("bert_accelerate.py", tmp_path, "--steps", "6", "--compression", "tiered",
                      "--precision-policy", "bf16,fp32")
    fig = _figures(log, steps=6)
    assert sum(fig["split"]) == 64
    for rank, dtype in ((0, "bf16"), (1, "fp32")):
        assert f"rank {rank} autocasts in {dtype}" in log, log[-4000:]


def test_cifar10_flag_alone_gives_the_model_a_3_channel_stem(monkeypatch):
    monkeypatch.syspath_prepend(str(RECIPES))
    from lightning_task import RecipeCLI
    from resnet_lightning import ResNetClassifier, VisionData, link_channels

    cli = RecipeCLI(ResNetClassifier, VisionData, links=link_channels,
                    args=["--data.data=cifar10", "--trainer.accelerator=cpu", "--trainer.devices=1",
                          "--trainer.strategy.compression=topk"])  # a strategy flag without naming the class
    assert cli.model.net.conv1.in_channels == 3  # nothing loaded or downloaded to learn it
    assert cli.trainer.strategy.hetero_config.compression.method == "topk"


def test_bert_lightning_fsdp2_config_shards_and_runs_passes(tmp_path):
    log = _lightning("bert_lightning.py", tmp_path, "--config", str(RECIPES / "configs" / "bert_fsdp.yaml"),
                     "--trainer.max_steps=4", "--data.batch_size=8", torchrun=True)
    split = re.search(r"global batch 16 split as \[(\d+), (\d+)\]", log)  # the probe's split of 2 x 8
    assert split and int(split.group(2)) > 2, log[-4000:]  # rank 1's share is above its cap of 2: passes
    assert re.search(r"^RESULT accuracy=[\d.]+ steps=4$", log, re.MULTILINE), log[-4000:]


def test_bert_hf_trainer_under_torchrun(tmp_path, monkeypatch):
    env = launch_env()
    rc, log = run_command([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                           "--master-port", env["MASTER_PORT"], str(RECIPES / "bert_hf_trainer.py"), "--cpu",
                           "--steps", "6", "--eval-batches", "1", "--output-dir", str(tmp_path / "out")], env=env, cwd=tmp_path, timeout=240)
    assert rc == 0, log[-6000:]
    fig = _figures(log, steps=6)
    assert sum(fig["split"]) == 64 and min(fig["split"]) >= 1  # 2 x per_device_train_batch_size 32, probed
    monkeypatch.syspath_prepend(str(RECIPES))
    from text_task import bert_classifier, keyword_tokenizer

    dense = _dense_ring_mb(_params(bert_classifier("tiny", vocab_size=len(keyword_tokenizer()))))
    assert fig["mb"] == pytest.approx([dense] * 2, abs=1e-3)  # the hook ran: a dense ring's bytes per step
