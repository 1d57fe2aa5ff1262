"""``bench balance``'s Lightning loop: ``L.Trainer`` with ``"ddp"``, PowerSGD DDP or ``HeteroStrategy``.

The LightningModule and the clock are the demo's (:mod:`hetero_strategy.commands.demo_worker`).
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L

from hetero_bench.balance_workload import (
    bench_model,
    hetero_options,
    runtime_record,
    test_accuracy,
    train_data,
)
from hetero_strategy.commands.demo_worker import Classifier, ClockCallback

__all__ = ["fit"]


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
