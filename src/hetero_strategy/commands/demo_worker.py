"""One rank of ``hetero-strategy demo``: ResNet-18 on digits under Lightning, ``"ddp"`` or hetero.

Started by the demo on every rank of the emulated cluster (torchrun-style environment). Built
from the library's pieces only: the digits loader and the ResNet of :mod:`hetero_strategy.workloads`,
its :class:`~hetero_strategy.workloads.step_clock.StepClock`, and ``HeteroStrategy``. Modes:

* ``ddp`` — Lightning's ``strategy="ddp"``, equal batches;
* ``hetero_auto`` — ``HeteroStrategy(calibrate=True)``: a probe of the real model splits the
  batch, then online calibration refines the split.

Each rank writes ``<mode>_r<RANK>.json``: per step its start time, batch size and compute time,
and the test accuracy after training.

Example::

    hetero-strategy emulate --compute 1.0,0.57 -- \\
        python -m hetero_strategy.commands.demo_worker --mode ddp --out /tmp/demo --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from hetero_strategy.workloads.step_clock import StepClock

__all__ = ["MODES", "Classifier", "ClockCallback", "main"]

MODES = ("ddp", "hetero_auto")


class Classifier(L.LightningModule):
    """``net`` trained on (image, label) batches with cross-entropy and SGD + momentum 0.9."""

    def __init__(self, net: nn.Module, lr: float) -> None:
        super().__init__()
        self.net, self.lr = net, lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class ClockCallback(L.Callback):
    """A :class:`StepClock` on Lightning's batch events (``self.clock``)."""

    def __init__(self) -> None:
        self.clock = StepClock()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.attach(pl_module)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        self.clock.batch_start(len(batch[0]))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, out: Any, batch: Any,
                           i: int) -> None:
        self.clock.batch_end()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.close()


def _fit(args: argparse.Namespace, world: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from hetero_strategy.lightning import HeteroStrategy
    from hetero_strategy.lightning.quiet import quiet_lightning, show_epoch_total
    from hetero_strategy.workloads.digits import accuracy, covering, digits_datasets
    from hetero_strategy.workloads.resnets import resnet18_imagenet_stem

    L.seed_everything(0, verbose=False)
    quiet_lightning()  # HeteroStrategy does this itself; the "ddp" run needs it too
    strategy: Any = "ddp" if args.mode == "ddp" else HeteroStrategy(
        overlap_comm=True, calibrate=True, cold_start_steps=args.cold_start,
        recalibrate_every=args.recalibrate_every, window=args.window)
    callback = ClockCallback()
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=args.progress, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[callback])
    show_epoch_total(trainer)
    train, test = digits_datasets(size=32)
    loader = DataLoader(covering(train, (args.steps + 2) * args.batch * world), batch_size=args.batch,
                        shuffle=True, drop_last=True)
    model = Classifier(resnet18_imagenet_stem(), args.lr)
    trainer.fit(model, loader)
    return callback.clock.record(args.mode) | {"accuracy": accuracy(model.net, test)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo_worker", description=__doc__.split("\n", 1)[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", required=True, help="directory; this rank writes <mode>_r<RANK>.json there")
    p.add_argument("--batch", type=int, default=128, help="mean per-rank batch B")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--cold-start", type=int, default=3, help="hetero: static steps before calibrating")
    p.add_argument("--recalibrate-every", type=int, default=8)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--progress", action="store_true", help="show Lightning's progress bar")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    result = _fit(args, world)
    result["rank"] = rank
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"{args.mode}_r{rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
