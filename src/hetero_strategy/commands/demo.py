"""``hetero-strategy demo``: plain DDP vs ``strategy="hetero"`` on an emulated fast + slow rank.

A torchvision ResNet-18 learns scikit-learn's bundled digits (upsampled to 32x32) on two emulated
ranks — rank 1 gets 57% of a core, as a 3090 next to an A100 — first under Lightning's ``"ddp"``,
then under ``HeteroStrategy(calibrate=True)`` (a probe of the real model splits the batch, online
calibration refines it). Real isolation (namespaces, tbf, cgroups) as root, else ``--simulate``.
Prints the cluster, Lightning's progress bar of each run, a summary table and the chart's path.

Example::

    hetero-strategy demo                   # ~2 minutes on 2 cores
    hetero-strategy demo --steps 60 --batch 128
    make demo                              # from a checkout: writes benchmarks/results/demo.json and .png

``demo.json`` keys: ``emulation``, ``compute``, ``link``, ``batch_per_rank``, ``steps``,
``measure_last``, ``command``, ``definitions`` (the module defining the figures), and ``modes``:
``ddp`` and ``hetero_auto``, each with ``samples_per_s``, ``step_s``, ``batch_sizes``,
``compute_s``, ``fast_rank_idle_fraction``, ``balance`` and ``accuracy``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from hetero_strategy.commands.flags import (
    UsageError,
    add_cluster_flags,
    cluster_args,
    count,
    number,
    output_dir,
)

NAME = "demo"
HELP = "DDP vs strategy='hetero' on an emulated fast + slow rank (ResNet-18 on digits); table + chart."

_WORKER = "hetero_strategy.commands.demo_worker"
_MODES = {"ddp": "plain DDP", "hetero_auto": "hetero"}  # hetero: probe, then online calibration
# NOTE: rank 0's TCPStore looks up the host name of each rank that connects, for its log; inside the
# emulator's network namespaces no resolver is reachable and 10.77.0.x is in no hosts file, so c10d
# warns "The hostname of the client socket cannot be retrieved. err=-3" (EAI_AGAIN) at every start.
# Harmless (it logs the address instead); libtorch's C++ log level is the only switch. Set
# TORCH_CPP_LOG_LEVEL yourself to see its warnings again.
_RANK_ENV = {"TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_flags(parser)
    parser.add_argument("--batch", type=count(1), default=128, help="mean per-rank batch B (default 128)")
    parser.add_argument("--steps", type=count(2), default=60, help="training steps per run (default 60)")
    parser.add_argument("--measure", type=count(1), default=12, help="figures use the last N steps (default 12)")
    parser.add_argument("--out", type=output_dir, default="demo_results", help="folder for demo.json and demo.png")
    parser.add_argument("--simulate", action="store_true",
                        help="loopback + duty-cycle compute (the default when not root)")
    parser.add_argument("--timeout", type=number(what="seconds"), default=600.0, help="seconds allowed per run")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.emulate import EmulatedCluster, EmulatorError
    from hetero_strategy.emulate.report import cluster_table

    console = Console()
    try:
        cluster_spec = cluster_args(args.compute, args.link)
        if args.measure >= args.steps:
            raise UsageError(f"--measure={args.measure} is invalid: it must be below --steps={args.steps}")
    except UsageError as e:
        console.print(f"demo: {e}", style="red", markup=False, highlight=False, soft_wrap=True)
        return 2
    simulate = args.simulate or os.geteuid() != 0
    if simulate and not args.simulate:
        console.print("[yellow]not root: running the SIMULATED cluster (loopback, duty-cycle compute)")
    results: dict[str, list[dict]] = {}
    try:
        with EmulatedCluster(*cluster_spec, simulate=simulate) as cluster, tempfile.TemporaryDirectory(prefix="hetero_demo_") as tmp:
            console.print(cluster_table(cluster.describe()))
            for mode, label in _MODES.items():
                console.rule(f"[bold]{label}")
                results[mode] = _launch(cluster, mode, args, Path(tmp))
    except (EmulatorError, RuntimeError) as e:
        console.print(f"[red]demo: {e}")
        return 1
    summary = {mode: figures(ranks, args.measure) for mode, ranks in results.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps({
        "emulation": "simulated" if simulate else "namespaces", "compute": args.compute, "link": args.link,
        "batch_per_rank": args.batch, "steps": args.steps, "measure_last": args.measure,
        "command": " ".join(["hetero-strategy", *sys.argv[1:]]), "definitions": "hetero_strategy.runtime.metrics",
        "modes": summary}, indent=2))
    _chart(summary, out / "demo.png", simulate)
    _table(console, summary, args, simulate)
    console.print(f"chart: {out / 'demo.png'}   figures: {out / 'demo.json'}")
    return 0


def _launch(cluster: Any, mode: str, args: argparse.Namespace, tmp: Path) -> list[dict]:
    cmd = [sys.executable, "-m", _WORKER, "--mode", mode, "--out", str(tmp), "--batch", str(args.batch),
           "--steps", str(args.steps), "--cold-start", "3", "--recalibrate-every", "8", "--window", "20",
           "--lr", "0.05", "--progress"]
    res = cluster.run(cmd, timeout=args.timeout, capture=False, env=_RANK_ENV)
    if not res.ok:
        raise RuntimeError(f"{mode} run failed (exit codes {res.returncodes}, timed out {res.timed_out})")
    return [json.loads((tmp / f"{mode}_r{k}.json").read_text()) for k in range(len(res.returncodes))]


def figures(ranks: list[dict], measure: int) -> dict[str, Any]:
    """Throughput, fast-rank idle and balance over the last ``measure`` steps of one run
    (definitions in :mod:`hetero_strategy.runtime.metrics`)."""
    from hetero_strategy.runtime.metrics import balance, fast_rank_idle, median_step

    step = median_step(ranks[0]["starts"], measure)
    sizes = [int(statistics.median(r["batches"][-measure:])) for r in ranks]
    compute = [statistics.median(r["compute_s"][-measure:]) for r in ranks]
    return {
        "samples_per_s": sum(sizes) / step, "step_s": step, "batch_sizes": sizes, "compute_s": compute,
        "fast_rank_idle_fraction": fast_rank_idle(step, compute, sizes), "balance": balance(compute),
        "accuracy": ranks[0].get("accuracy"),
    }


def _table(console: Any, summary: dict[str, dict], args: argparse.Namespace, simulate: bool) -> None:
    from rich.table import Table

    tag = " (SIMULATED)" if simulate else ""
    table = Table(title=f"demo: ResNet-18 on digits, compute {args.compute}, B={args.batch}{tag}")
    for col in ("run", "samples/s", "vs DDP", "fast rank idle*", "balance", "batch sizes", "test acc."):
        table.add_column(col, justify="left" if col in ("run", "batch sizes") else "right")
    base = summary["ddp"]["samples_per_s"]
    for mode, f in summary.items():
        table.add_row(_MODES[mode], f"{f['samples_per_s']:.0f}", f"{f['samples_per_s'] / base:.2f}x",
                      f"{100 * f['fast_rank_idle_fraction']:.0f}%", f"{f['balance']:.2f}",
                      "/".join(map(str, f["batch_sizes"])), f"{f['accuracy']:.3f}")
    console.print(table)
    console.print("* share of the fast rank's step spent not computing: waiting for the slow rank plus "
                  "communication that compute does not hide. hetero = probe of the real model, then online "
                  "calibration.")


def _chart(summary: dict[str, dict], path: Path, simulate: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    labels, compute, idle = [], [], []
    for mode, f in summary.items():
        for r, (b, c) in enumerate(zip(f["batch_sizes"], f["compute_s"])):
            labels.append(f"{_MODES[mode]} r{r} (b={b})")
            compute.append(c)
            idle.append(max(0.0, f["step_s"] - c))
    y = list(range(len(labels)))
    ax.barh(y, compute, color="#1f77b4", label="compute")
    ax.barh(y, idle, left=compute, color="#d62728", label="waiting + communication")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step (median of the measured steps)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    ax.set_title("Per-rank step: plain DDP vs hetero" + (" [SIMULATED]" if simulate else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
