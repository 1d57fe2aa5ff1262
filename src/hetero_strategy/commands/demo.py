"""``hetero-strategy demo``: a real 2-rank CPU training with strategy="hetero" on embedded defaults.

Trains a small classifier on scikit-learn's bundled digits with Lightning's own launcher (it
re-runs this command once per rank), then prints per-rank batch sizes, balance and accuracy.
"""

from __future__ import annotations

import argparse

NAME = "demo"
HELP = "Train on scikit-learn digits with 2 CPU ranks and strategy='hetero'; print a summary."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    parser.add_argument("--batch-size", type=int, default=64, help="mean per-rank batch B (default 64)")
    parser.add_argument("--capacities", default="1.0,0.57",
                        help="relative rank speeds; batch shares follow them (default 1.0,0.57)")


def run(args: argparse.Namespace) -> int:
    import lightning as L
    from torch.utils.data import DataLoader

    from hetero_strategy import HeteroStrategy
    from hetero_strategy.workloads.digits import DigitsClassifier, digits_datasets

    L.seed_everything(0, verbose=False)
    caps = [float(c) for c in args.capacities.split(",")]
    train, test = digits_datasets()
    model = DigitsClassifier(arch="mlp")
    strategy = HeteroStrategy(capacities=caps)
    trainer = L.Trainer(accelerator="cpu", devices=len(caps), strategy=strategy, max_epochs=args.epochs,
                        logger=False, enable_checkpointing=False, log_every_n_steps=5)
    trainer.fit(model, DataLoader(train, batch_size=args.batch_size, shuffle=True),
                DataLoader(test, batch_size=128))
    metrics = strategy.timer.gather_metrics(strategy.sampler.batch_sizes[strategy.global_rank])
    if trainer.is_global_zero:
        _summary(strategy.sampler.batch_sizes, metrics, float(trainer.callback_metrics["val_acc"]))
    return 0


def _summary(sizes: list[int], metrics: dict[str, float], accuracy: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hetero demo: digits, 2 CPU ranks (last step)")
    for col in ("rank", "batch size", "compute s", "step s", "samples/s"):
        table.add_column(col, justify="right")
    for r, b in enumerate(sizes):
        table.add_row(str(r), str(b), f"{metrics[f'hetero/compute_s_r{r}']:.4f}",
                      f"{metrics[f'hetero/step_s_r{r}']:.4f}", f"{metrics[f'hetero/samples_per_s_r{r}']:.0f}")
    console = Console()
    console.print(table)
    console.print(f"global batch {sum(sizes)}, balance {metrics['hetero/balance']:.2f}, "
                  f"validation accuracy {accuracy:.3f}")
