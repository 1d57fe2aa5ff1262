"""The training loop both Accelerate recipes use (``resnet_accelerate.py``, ``bert_accelerate.py``).

A recipe adds its own flags and hands :func:`train` a ``build(args) -> Parts``: its model,
optimizer, data sets and ``forward_batch(model, batch) -> (loss, logits, labels)``. ``build``
runs on the main process first, so a download happens once and the other ranks read the cache.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from report import final_report
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.utils.data import DataLoader, Dataset

from hetero_strategy.accelerate import HeteroPlugin

ForwardBatch = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class Parts:
    """What a recipe trains: built by its ``build(args)``."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_set: Dataset
    test_set: Dataset
    forward_batch: ForwardBatch
    collate_fn: Any = None


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every Accelerate recipe takes; a recipe adds its model's and data's."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=32, help="mean per-rank batch (global = this x ranks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-batches", type=int, default=None, help="held-out batches to score (default: all)")
    p.add_argument("--hetero-config", default=None,
                   help="hetero YAML from `hetero-strategy config` (default: $HETERO_STRATEGY_CONFIG)")
    p.add_argument("--compression", default=None, help="none, topk, tiered, onebit, fp16, bf16, powersgd "
                                                        "(default: the hetero config's)")
    p.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=None,
                   help="rebalance batch shares while training (default: the hetero config's)")
    p.add_argument("--precision-policy", default=None, help="auto, bf16, fp16, fp32 or a per-rank list a,b")
    p.add_argument("--log-with", default=None, help="an Accelerate tracker (tensorboard after pip install tensorboard, "
                                                    "wandb ...)")
    p.add_argument("--project-dir", default="logs", help="where trackers write")
    return p


def _policy(value: str | None) -> Any:
    return value.split(",") if value and "," in value else value


def train(args: argparse.Namespace, build: Callable[[argparse.Namespace], Parts]) -> None:
    """Train ``args.steps`` optimizer steps with HeteroPlugin, then print the final figures."""
    accelerator = Accelerator(log_with=args.log_with, project_dir=args.project_dir)
    set_seed(args.seed)
    with accelerator.main_process_first():
        parts = build(args)
    forward_batch = parts.forward_batch
    if args.log_with:
        accelerator.init_trackers("hetero-recipe", config={k: v for k, v in vars(args).items()
                                                           if isinstance(v, (int, float, str, bool))})
    fields = {"compression": args.compression, "calibrate": args.calibrate,
              "precision_policy": _policy(args.precision_policy)}
    plugin = HeteroPlugin(args.hetero_config, log_every_n_steps=5, **{k: v for k, v in fields.items() if v is not None})
    loader = DataLoader(parts.train_set, batch_size=args.batch_size, shuffle=True, collate_fn=parts.collate_fn)
    test_loader = DataLoader(parts.test_set, batch_size=2 * args.batch_size,  # no gradients: 2x fits
                             collate_fn=parts.collate_fn)
    model, optimizer, loader, test_loader = plugin.prepare(
        accelerator, parts.model, parts.optimizer, loader, test_loader,
        loss_fn=lambda module, batch: forward_batch(module, batch)[0], max_steps=args.steps)

    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[loss]}"))
    step = 0
    with Progress(*columns, disable=not accelerator.is_main_process) as progress:
        task = progress.add_task("train", total=args.steps, loss="")
        model.train()
        while step < args.steps:
            for batch in loader:
                with plugin.autocast():
                    loss, _, _ = forward_batch(model, batch)
                plugin.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                progress.update(task, advance=1, loss=f"loss {loss.item():.3f}")
                if step >= args.steps:
                    break
    summary = plugin.summary()
    accuracy = evaluate(accelerator, model, test_loader, forward_batch, args.eval_batches)
    accelerator.log({"val_acc": accuracy}, step=step)
    accelerator.print(final_report(summary, accuracy, steps=step))
    plugin.close()
    # NOTE: free the DDP model before interpreter shutdown: gloo work released during finalization
    # can abort the process ("terminate called without an active exception", pytorch/pytorch#179291)
    accelerator.free_memory()
    gc.collect()
    accelerator.end_training()


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader, forward_batch: ForwardBatch,
             max_batches: int | None = None) -> float:
    """Held-out accuracy over the test set (gather_for_metrics drops the shards' padding)."""
    model.eval()
    correct = total = 0
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        _, logits, labels = forward_batch(model, batch)
        pred, labels = accelerator.gather_for_metrics((logits.argmax(dim=-1), labels))
        correct += int((pred == labels).sum())
        total += len(labels)
    model.train()
    return correct / max(total, 1)
