"""The figures every recipe prints at the end, whichever framework ran it."""

from __future__ import annotations

from typing import Any


def final_report(summary: dict[str, Any] | None, accuracy: float, *, steps: int) -> str:
    """A rich table of the run: batch split, throughput, balance, wire bytes per step, accuracy.

    ``summary`` is ``HeteroRuntime.summary()`` (None when the run did not use hetero, e.g.
    ``--trainer.strategy=ddp``: then only the accuracy is known).
    """
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"final figures after {steps} optimizer steps", show_header=False)
    if summary is not None:
        table.add_row("batch split", " + ".join(map(str, summary["batch_sizes"]))
                      + f" = {sum(summary['batch_sizes'])}")
        table.add_row("throughput", f"{summary['samples_per_s']:.1f} samples/s (median wall step {summary['step_s']:.3f} s)")
        table.add_row("balance", f"{summary['balance']:.2f}")
        table.add_row("bytes sent per step", ", ".join(f"r{r}: {b / 1e6:.3f} MB"
                                                         for r, b in enumerate(summary["bytes_sent_per_step"])))
    table.add_row("held-out accuracy", f"{100 * accuracy:.1f}%")
    console = Console(width=100)
    with console.capture() as capture:
        console.print(table)
    # one line the benchmark scripts can read back
    return capture.get() + f"RESULT accuracy={accuracy:.4f} steps={steps}\n"
