"""The LightningModule and CLI both Lightning recipes use (``resnet_lightning.py``, ``bert_lightning.py``).

A recipe subclasses :class:`ClassifierModule` with its model and a ``forward_batch`` that returns
(loss, logits, labels), writes a small LightningDataModule, and calls :func:`run`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from report import final_report

import hetero_strategy  # importing it registers strategy="hetero"


class ClassifierModule(L.LightningModule):
    """Training on ``forward_batch``'s loss; held-out accuracy from correct/total counts summed over
    ranks (Lightning's DistributedSampler pads the held-out set to a multiple of the world size,
    so up to world_size - 1 samples count twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.correct = 0
        self.total = 0

    def forward_batch(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, _, _ = self.forward_batch(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        _, logits, labels = self.forward_batch(batch)
        self.correct += int((logits.argmax(dim=-1) == labels).sum())
        self.total += len(labels)

    def on_validation_epoch_end(self) -> None:
        counts = torch.tensor([self.correct, self.total], dtype=torch.float64, device=self.device)
        counts = self.trainer.strategy.reduce(counts, reduce_op="sum")  # a sum, not a mean of means
        # identical on every rank, so sync_dist averages equal values
        self.log("val_acc", float(counts[0] / counts[1].clamp(min=1)), prog_bar=True, sync_dist=True)
        self.correct = self.total = 0


class RecipeCLI(LightningCLI):
    """LightningCLI with hetero's defaults: HeteroStrategy, a CSV logger, metrics every 5 steps.

    The strategy default is the class, not the name "hetero", so ``--trainer.strategy.compression=topk``
    works without first naming the class; ``--trainer.strategy=ddp`` still selects plain DDP.
    """

    def __init__(self, model_class: type, datamodule_class: type, links: Any = None, description: str = "",
                 **kwargs: Any) -> None:
        self.links = links  # parser -> None: arguments one recipe links (e.g. the tokenizer's size)
        defaults = {
            "strategy": {"class_path": "hetero_strategy.HeteroStrategy"},
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs"}},
            "log_every_n_steps": 5,
            "max_epochs": 5,
            "enable_checkpointing": False,
        }
        super().__init__(model_class, datamodule_class, trainer_defaults=defaults, run=False,
                         seed_everything_default=0, save_config_kwargs={"overwrite": True},
                         parser_kwargs={"description": description,
                                        "formatter_class": argparse.RawDescriptionHelpFormatter}, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        if self.links is not None:
            self.links(parser)


def run(model_class: type, datamodule_class: type, args: list[str] | None = None, links: Any = None) -> None:
    """Parse the command line, fit, measure held-out accuracy, print the final figures on rank 0."""
    script = sys.modules["__main__"].__doc__ or ""  # the recipe's commands, for --help
    cli = RecipeCLI(model_class, datamodule_class, links=links, description=script, args=args)
    trainer = cli.trainer
    trainer.fit(cli.model, datamodule=cli.datamodule)
    strategy = trainer.strategy
    # collective on every rank, before validate() re-enters the loop
    summary = strategy.runtime.summary() if isinstance(strategy, hetero_strategy.HeteroStrategy) else None
    trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    if trainer.is_global_zero:
        print(final_report(summary, float(trainer.callback_metrics["val_acc"]), steps=trainer.global_step),
              flush=True)
