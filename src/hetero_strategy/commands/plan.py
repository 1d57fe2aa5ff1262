"""``hetero-strategy plan``: predict a heterogeneous cluster's step time before anyone launches it.

Example::

    hetero-strategy plan docs/clusters/two_nodes.yaml --model resnet50 --global-batch 512 --json plan.json
    hetero-strategy plan node-a.json node-b.json --model bert-base          # profiles, one per node
    hetero-strategy plan docs/clusters/mixed_node.yaml --model bert-base --scale --chart scale.png
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from hetero_strategy.commands.flags import count, input_file, output_file

NAME = "plan"
HELP = ("Predict step time, samples/s, batch split and bytes per rank of DDP, hetero and hetero with the auto "
        "codec on a cluster described by a YAML file or profiles, from a model built on the meta device.")

__all__ = ["FAST_EXIT", "HELP", "NAME", "add_arguments", "run"]

FAST_EXIT = True
"""From the console script, end without the interpreter's teardown (``cli._leave``): nothing here runs on."""

_LABELS = {"ddp": "DDP", "ddp_powersgd": "DDP + PowerSGD", "hetero": "hetero", "hetero_auto": "hetero + auto codec"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cluster", nargs="+", type=input_file, metavar="CLUSTER",
                        help="a cluster YAML (docs/planner.md), and/or profile JSONs from `hetero-strategy profile`")
    parser.add_argument("--model", required=True,
                        help="resnet18, resnet34, resnet50, resnet101, bert-base, bert-large, or module:callable")
    parser.add_argument("--global-batch", type=count(1), default=None,
                        help="samples per step over all ranks (default: 32 per rank)")
    parser.add_argument("--json", type=output_file, default=None, help="write the prediction here")
    parser.add_argument("--chart", type=output_file, default=None, help="PNG of --scale (samples/s, bytes per rank vs W)")
    parser.add_argument("--scale", action="store_true",
                        help="also predict W = 2 ... 1024 ranks, the cluster's mix replicated, 32 per rank (or the "
                             "mean of --global-batch)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.balance.plan import plan, scale
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster
    from hetero_strategy.config import ConfigError

    if args.chart and not args.scale:
        print("plan: --chart draws the --scale sweep; add --scale")
        return 2
    try:
        cluster = read_cluster(args.cluster)
        model = describe_model(args.model)
        batch = args.global_batch or 32 * cluster.world
        if batch < cluster.world:
            raise ConfigError(f"--global-batch={batch} is invalid: give at least one sample per rank "
                              f"({cluster.world} ranks)")
        result = plan(cluster, model, batch)
        if args.scale:
            result["scale"] = scale(cluster, model, max(1, batch // cluster.world))
    except ConfigError as e:
        print(f"plan: {e}")
        return 2
    console = Console()
    console.print(_table(result))
    console.print(_summary(result), markup=False, highlight=False)
    if args.scale:
        console.print(_scale_table(result["scale"]))
    if args.json:
        from hetero_strategy.config.files import write_atomic

        write_atomic(args.json, json.dumps(result, indent=2))
        console.print(f"plan: wrote {args.json}", markup=False)
    if args.chart:
        _chart(result, args.chart)
        console.print(f"plan: wrote {args.chart}", markup=False)
    return 0


def _groups(result: dict[str, Any], sizes: list[int]) -> str:
    """Batch sizes by (node, card): "dgx/A100-80GB x4: 46" (a 1024-rank list would not fit)."""
    ranks = result["cluster"]["ranks"]
    seen = Counter((r["node"], r["card"], b) for r, b in zip(ranks, sizes))
    return ", ".join(f"{card} x{n}: {b}" for (node, card, b), n in seen.items())


def _table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    m, c = result["model"], result["cluster"]
    table = Table(title=f"{m['name']} ({m['parameters'] / 1e6:.1f} M parameters, {m['flops_per_sample'] / 1e9:.3g} "
                        f"GFLOP/sample) on {c['world']} ranks, global batch {result['global_batch']}")
    for col in ("method", "codec", "step ms", "samples/s", "vs DDP", "MB/rank/step", "batch sizes"):
        table.add_column(col)
    ddp = result["methods"]["ddp"]["samples_per_s"]
    for name in result["ranked"]:
        p = result["methods"][name]
        table.add_row(_LABELS[name], p["codec"], f"{1e3 * p['step_s']:.1f}", f"{p['samples_per_s']:.0f}",
                      f"{p['samples_per_s'] / ddp:.2f}x", f"{p['bytes_per_rank'] / 1e6:.2f}",
                      _groups(result, p["batch_sizes"]))
    return table


def _summary(result: dict[str, Any]) -> str:
    s = result["speedup"]
    caps = result["memory_caps"]
    split = [p for p in result["methods"]["hetero"]["passes"] if p > 1]
    memory = ("memory: unknown for some ranks" if None in caps else
              f"memory caps (samples per pass): {_groups(result, caps)}" +
              (f"; hetero micro-batches on {len(split)} ranks" if split else ""))
    return (f"predicted: hetero {s['hetero_vs_ddp']:.2f}x DDP; hetero + auto codec "
            f"({result['methods']['hetero_auto']['codec']}) {s['hetero_auto_vs_ddp']:.2f}x DDP and "
            f"{s['hetero_auto_vs_ddp_powersgd']:.2f}x DDP + PowerSGD\n{memory}")


def _scale_table(sc: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="--scale: samples/s (and the auto codec) vs world size")
    table.add_column("W")
    for name in sc["methods"]:
        table.add_column(_LABELS[name])
    table.add_column("auto codec")
    for i, w in enumerate(sc["worlds"]):
        table.add_row(str(w), *[f"{sc['methods'][m]['samples_per_s'][i]:.0f}" for m in sc["methods"]],
                      sc["methods"]["hetero_auto"]["codec"][i])
    return table


def _chart(result: dict[str, Any], path: str) -> None:
    # NOTE: a bare Figure, not pyplot: no GUI backend to import, nothing global to close
    from matplotlib.figure import Figure

    sc = result["scale"]
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for name, row in sc["methods"].items():
        ax1.plot(sc["worlds"], row["samples_per_s"], marker="o", label=_LABELS[name])
        ax2.plot(sc["worlds"], [b / 1e6 for b in row["bytes_per_rank"]], marker="o", label=_LABELS[name])
    for ax, what in ((ax1, "samples/s (predicted)"), (ax2, "MB sent per rank per step")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks (W)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(f"{result['model']['name']}: the cluster's mix replicated, {sc['worlds'][0]}..{sc['worlds'][-1]} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
