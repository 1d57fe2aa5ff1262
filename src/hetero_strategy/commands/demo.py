"""``hetero-strategy demo``: plain DDP vs hetero on an emulated fast + slow rank, alternating.

A torchvision ResNet-18 learns scikit-learn's bundled digits (upsampled to 32x32) on two emulated
ranks — rank 1 gets 57% of a core, as a 3090 next to an A100. One job trains two copies of the
model side by side (:mod:`.demo_worker`): plain ``DistributedDataParallel`` with equal batches, and
the hetero runtime (a probe of the real model splits the batch, online calibration refines it),
``--block`` steps of each in turn for ``--rounds`` rounds, so both see the same machine. Real
isolation (namespaces, tbf, cgroups) as root, else ``--simulate``. Prints the cluster, a line per
round, a table of medians with their spread, and the chart's path.

Example::

    hetero-strategy demo                          # ~5 minutes on 2 cores
    hetero-strategy demo --rounds 10 --block 6
    hetero-strategy demo --summary benchmarks/results/demo.json   # the README's table, from a result
    make demo                                     # from a checkout: writes benchmarks/results/demo.json and .png

``demo.json`` keys: ``emulation``, ``compute``, ``link``, ``batch_per_rank``, ``rounds``, ``block``,
``warmup_rounds``, ``seconds`` (the training job's wall time), ``command``, ``commit``,
``definitions`` (the module defining the figures), ``speedup`` (``median``, ``rounds``, ``min``,
``max``), ``probe_split``, ``decisions`` (the calibrator's), and ``modes``: ``ddp`` and
``hetero_auto``, each with ``samples_per_s``, ``samples_per_s_rounds``, ``step_s``,
``batch_sizes`` (per-rank medians over the measured rounds), ``compute_s``,
``fast_rank_idle_fraction``, ``balance`` and ``accuracy``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
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
from hetero_strategy.commands.provenance import source_commit

NAME = "demo"
HELP = "DDP vs strategy='hetero' on an emulated fast + slow rank (ResNet-18 on digits); table + chart."

_WORKER = "hetero_strategy.commands.demo_worker"
# NOTE: rank 0's TCPStore looks up the host name of each rank that connects, for its log; inside the
# emulator's network namespaces no resolver is reachable and 10.77.0.x is in no hosts file, so c10d
# warns "The hostname of the client socket cannot be retrieved. err=-3" (EAI_AGAIN) at every start.
# Harmless (it logs the address instead); libtorch's C++ log level is the only switch. Set
# TORCH_CPP_LOG_LEVEL yourself to see its warnings again.
_RANK_ENV = {"TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_flags(parser)
    parser.add_argument("--batch", type=count(1), default=128, help="mean per-rank batch B (default 128)")
    parser.add_argument("--rounds", type=count(2), default=12, help="rounds of each mode's block (default 12)")
    parser.add_argument("--block", type=count(1), default=6, help="steps of one mode per round (default 6)")
    parser.add_argument("--warmup-rounds", type=count(0), default=3,
                        help="rounds left out of the figures while the hetero split settles (default 3)")
    parser.add_argument("--out", type=output_dir, default="demo_results", help="folder for demo.json and demo.png")
    parser.add_argument("--summary", metavar="DEMO_JSON",
                        help="print the Markdown table of a demo.json (the README's) and exit")
    parser.add_argument("--simulate", action="store_true",
                        help="loopback + duty-cycle compute (the default when not root)")
    parser.add_argument("--timeout", type=number(what="seconds"), default=900.0, help="seconds allowed for the job")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.commands.demo_report import markdown
    from hetero_strategy.emulate import EmulatedCluster, EmulatorError
    from hetero_strategy.emulate.report import cluster_table

    # NOTE: piped (make demo > log) rich assumes 80 columns and cuts the table's ranges short
    console = Console(width=None if sys.stdout.isatty() else 140)
    if args.summary is not None:
        sys.stdout.write(markdown(json.loads(Path(args.summary).read_text())))
        return 0
    try:
        cluster_spec = cluster_args(args.compute, args.link)
        if args.warmup_rounds >= args.rounds:
            raise UsageError(f"--warmup-rounds={args.warmup_rounds} is invalid: it must be below --rounds={args.rounds}")
    except UsageError as e:
        console.print(f"demo: {e}", style="red", markup=False, highlight=False, soft_wrap=True)
        return 2
    simulate = args.simulate or os.geteuid() != 0
    if simulate and not args.simulate:
        console.print("[yellow]not root: running the SIMULATED cluster (loopback, duty-cycle compute)")
    try:
        with EmulatedCluster(*cluster_spec, simulate=simulate) as cluster, tempfile.TemporaryDirectory(prefix="hetero_demo_") as tmp:
            console.print(cluster_table(cluster.describe()))
            t0 = time.perf_counter()
            ranks = _launch(cluster, args, Path(tmp))
            seconds = time.perf_counter() - t0
    except (EmulatorError, RuntimeError) as e:
        console.print(f"[red]demo: {e}")
        return 1
    result = _result(ranks, args, simulate, seconds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(result, indent=2))
    from hetero_strategy.commands.demo_report import chart

    chart(result["modes"], out / "demo.png", simulate)
    _table(console, result, simulate)
    console.print(f"chart: {out / 'demo.png'}   figures: {out / 'demo.json'}")
    return 0


def _launch(cluster: Any, args: argparse.Namespace, tmp: Path) -> list[dict]:
    cmd = [sys.executable, "-m", _WORKER, "--out", str(tmp), "--batch", str(args.batch), "--rounds", str(args.rounds),
           "--block", str(args.block), "--cold-start", "3", "--recalibrate-every", "8", "--window", "20",
           "--lr", "0.05", "--progress"]
    res = cluster.run(cmd, timeout=args.timeout, capture=False, env=_RANK_ENV)
    if not res.ok:
        raise RuntimeError(f"the demo job failed (exit codes {res.returncodes}, timed out {res.timed_out})")
    return [json.loads((tmp / f"r{k}.json").read_text()) for k in range(len(res.returncodes))]


def _result(ranks: list[dict], args: argparse.Namespace, simulate: bool, seconds: float) -> dict[str, Any]:
    from hetero_strategy.commands.demo_report import figures, speedup

    modes = {mode: figures(ranks, mode, args.warmup_rounds) for mode in ("ddp", "hetero_auto")}
    return {
        "emulation": "simulated" if simulate else "namespaces", "compute": args.compute, "link": args.link,
        "batch_per_rank": args.batch, "rounds": args.rounds, "block": args.block, "warmup_rounds": args.warmup_rounds,
        "seconds": seconds, "command": " ".join(["hetero-strategy", *sys.argv[1:]]), "commit": source_commit(),
        "definitions": "hetero_strategy.runtime.metrics", "speedup": speedup(modes),
        "probe_split": ranks[0]["probe_split"], "decisions": ranks[0]["decisions"], "modes": modes}


def _table(console: Any, result: dict[str, Any], simulate: bool) -> None:
    from rich.table import Table

    from hetero_strategy.commands.demo_report import rows

    tag = " (SIMULATED)" if simulate else ""
    header, *body = rows(result)
    table = Table(title=f"demo: ResNet-18 on digits, compute {result['compute']}, B={result['batch_per_rank']}{tag}")
    for col in header:
        table.add_column(col, justify="left" if col.startswith(("run", "batch")) else "right")
    for row in body:
        table.add_row(*row)
    console.print(table)
    measured = result["rounds"] - result["warmup_rounds"]
    console.print(f"Medians over the last {measured} of {result['rounds']} rounds (DDP and hetero alternating, "
                  f"{result['block']} steps each), ranges over those rounds. Fast rank idle: the share of the fast "
                  "rank's step spent not computing (waiting for the slow rank, plus communication compute does not "
                  f"hide). hetero = probe of the real model ({result['probe_split']}), then online calibration. "
                  f"The job took {result['seconds'] / 60:.1f} min.")
