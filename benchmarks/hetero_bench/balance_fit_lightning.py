"""``bench balance``'s Lightning loop: ``L.Trainer`` with ``"ddp"``, PowerSGD DDP or ``HeteroStrategy``."""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
from torch import nn

from hetero_bench.balance_workload import (
    bench_model,
    hetero_options,
    runtime_record,
    test_accuracy,
    train_data,
)
from hetero_strategy.workloads.step_clock import StepClock

__all__ = ["Classifier", "ClockCallback", "fit"]


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


def fit(mode: str, args: argparse.Namespace, world: int, steps: int) -> dict:
    from torch.utils.data import DataLoader

    from hetero_strategy import HeteroStrategy

    L.seed_everything(0, verbose=False)
    if mode in ("solo", "ddp"):
        strategy: Any = "auto" if mode == "solo" else "ddp"
    elif mode == "ddp_powersgd":
        # Lightning's DDPStrategy registers ddp_comm_hook on CUDA only: on CPU this would be dense DDP
        raise ValueError("mode ddp_powersgd needs --framework ddp (Lightning registers DDP comm hooks on CUDA only)")
    else:
        strategy = HeteroStrategy(**hetero_options(mode, args, world))
    callback = ClockCallback()
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=args.progress, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[callback])
    loader = DataLoader(train_data(args.batch, world, steps), batch_size=args.batch, shuffle=True, drop_last=True)
    model = Classifier(bench_model(args.model), args.lr)
    trainer.fit(model, loader)
    out = callback.clock.record(mode) | runtime_record(getattr(trainer.strategy, "runtime", None))
    if args.accuracy:
        out["accuracy"] = test_accuracy(model.net)
    return out
