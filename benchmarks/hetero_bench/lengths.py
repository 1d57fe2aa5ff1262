"""``hetero-strategy bench lengths``: dealing by cost vs by count on a length-skewed text task.

Two ranks of different speed train the packed-token model of
:mod:`hetero_strategy.workloads.skewed_text` (15% of sequences 5-10x longer than the rest; a
step costs its tokens). Round 1 measures each rank's tokens/s alone and fixes the capacity split
from it; then every round runs, alternating the order: plain DDP (equal counts), the hetero
split by count, and the same split with ``sample_cost="lengths"`` (each global batch dealt out
by tokens). Figures are medians over rounds with their spread; ``balance`` is the median over
steps of one step's balance across ranks (:func:`~hetero_strategy.runtime.metrics.balance`).

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench lengths --json benchmarks/results/lengths.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetero_bench import RESULTS
from hetero_bench._ranks import run_job, worker
from hetero_bench.balance_summary import spread
from hetero_strategy.commands.flags import add_cluster_flags, cluster_args, count, number, output_file
from hetero_strategy.runtime.metrics import balance, median_step

__all__ = ["add_arguments", "figures", "run"]

_WORKER = "lengths_worker"
_TRAININGS = ("ddp", "count", "cost")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "lengths.json"), help="result JSON")
    add_cluster_flags(parser)
    parser.add_argument("--batch", type=count(1), default=32, help="mean samples per rank per step (default 32)")
    parser.add_argument("--steps", type=count(2), default=40, help="training steps per run (default 40)")
    parser.add_argument("--measure", type=count(1), default=30, help="figures use the last N steps (default 30)")
    parser.add_argument("--rounds", type=count(1), default=5, help="alternating rounds (default 5)")
    parser.add_argument("--simulate", action="store_true", help="no root: loopback + duty-cycle compute")
    parser.add_argument("--timeout", type=number(what="seconds"), default=600.0, help="seconds allowed per launch")


def figures(ranks: list[dict], measure: int, global_batch: int) -> dict[str, float]:
    """One run's step time, samples/s, tokens/s and per-step balance over its last ``measure`` steps."""
    step = median_step(ranks[0]["starts"], measure)
    n = len(ranks[0]["compute_s"])
    last = range(max(0, n - measure), n)
    tokens = statistics.median(sum(r["batches"][k] for r in ranks) for k in last)
    return {"step_s": step, "samples_per_s": global_batch / step, "tokens_per_s": tokens / step,
            "balance": statistics.median(balance([r["compute_s"][k] for r in ranks]) for k in last)}


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from hetero_strategy.balance.shares import split_batch
    from hetero_strategy.emulate import EmulatedCluster, EmulatorError
    from hetero_strategy.emulate.report import cluster_table
    console = Console()
    compute, links = cluster_args(args.compute, args.link)
    if args.measure >= args.steps:
        console.print(f"bench lengths: --measure={args.measure} is invalid: it must be below --steps", style="red",
                      markup=False, highlight=False)
        return 2
    started = time.perf_counter()
    g = args.batch * len(compute)
    rounds, sizes, solo = [], None, None
    try:
        with EmulatedCluster(compute, links, simulate=args.simulate) as cluster, \
                tempfile.TemporaryDirectory(prefix="bench_lengths_") as tmp:
            console.print(cluster_table(cluster.describe()))
            ranks = _launch(cluster, "solo", None, args, Path(tmp, "solo"), console)
            solo = [figures([r], args.measure, args.batch)["tokens_per_s"] for r in ranks]
            sizes = split_batch(g, solo)
            console.print(f"solo tokens/s {[round(s) for s in solo]}: split {sizes}")
            for i in range(args.rounds):
                order = _TRAININGS if i % 2 == 0 else _TRAININGS[::-1]
                rounds.append({m: figures(_launch(cluster, m, None if m == "ddp" else sizes, args,
                                                  Path(tmp, f"round{i}", m), console), args.measure, g)
                               for m in order})
                console.print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                    f"{m} {rounds[-1][m]['samples_per_s']:.0f}/s (balance {rounds[-1][m]['balance']:.2f})"
                    for m in _TRAININGS))
            description = cluster.describe()
    except (EmulatorError, RuntimeError) as e:
        console.print(f"[red]bench lengths:[/red] {escape(str(e))}")  # gloo errors hold [brackets]
        return 1
    result = _summary(rounds, args, description, solo, sizes)
    result["wall_s"] = time.perf_counter() - started
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    _print(result, console)
    console.print(f"wrote {path}")
    return 0


def _launch(cluster: Any, mode: str, sizes: list[int] | None, args: argparse.Namespace, out: Path,
            console: Any) -> list[dict]:
    cmd = [*worker(_WORKER), "--mode", mode, "--out", str(out), "--batch", str(args.batch),
           "--steps", str(args.steps)] + ([] if sizes is None else ["--sizes", ",".join(map(str, sizes))])
    return run_job(cluster, cmd, [mode], out, args.timeout, console, mode)[mode]


def _summary(rounds: list[dict], args: argparse.Namespace, description: list[dict], solo: list[float],
             sizes: list[int]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "lengths", "emulation": "simulated" if args.simulate else "namespaces",
        "cluster": description, "command": " ".join(sys.argv),
        "config": {"compute": args.compute, "link": args.link, "batch_per_rank": args.batch, "steps": args.steps,
                   "measure_last": args.measure, "rounds": args.rounds,
                   "workload": "packed-token residual MLP (width 128, 2 blocks), 15% of sequences 160-320 "
                               "tokens, the rest 8-32"},
        "solo_tokens_per_s": solo, "batch_sizes": sizes, "spread": {},
    }
    for m in _TRAININGS:
        for key in ("samples_per_s", "tokens_per_s", "balance"):
            s = spread([r[m][key] for r in rounds])
            result[f"{m}_{key}"] = s["median"]
            result["spread"][f"{m}_{key}"] = s
    for a, b in (("cost", "count"), ("cost", "ddp"), ("count", "ddp")):
        result[f"{a}_vs_{b}"] = statistics.median(r[a]["samples_per_s"] / r[b]["samples_per_s"] for r in rounds)
    result["rounds"] = rounds
    return result


def _print(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    tag = " [bold red](SIMULATED)" if result["emulation"] == "simulated" else ""
    table = Table(title=f"bench lengths: compute {result['config']['compute']}, split {result['batch_sizes']}{tag}")
    for col in ("training", "samples/s (min-max)", "tokens/s", "balance per step", "vs DDP"):
        table.add_column(col, justify="left" if col == "training" else "right")
    for m in _TRAININGS:
        s = result["spread"][f"{m}_samples_per_s"]
        table.add_row(m, f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})", f"{result[f'{m}_tokens_per_s']:.0f}",
                      f"{result[f'{m}_balance']:.2f}", "1.00" if m == "ddp" else f"{result[f'{m}_vs_ddp']:.2f}")
    console.print(table)
    console.print(f"dealing by cost vs by count: {result['cost_vs_count']:.2f}x samples/s (median of per-round ratios)")
