"""``hetero-strategy bench``: benchmarks, one sub-mode each (``compression``, ``balance``, ...).

The benchmarks live in the checkout's top-level ``benchmarks/hetero_bench/`` (one module per mode,
imported lazily, so one missing or slow-to-import benchmark never breaks the others; each exposes
``add_arguments`` and ``run``), not in the installed package: they need the ``recipes`` extra and
test stand-ins the library must not ship. From an editable install (``make install``) this command
finds them beside ``src/``; from a wheel it says how to get them and exits with status 2.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench compression --json benchmarks/results/compression.json
    hetero-strategy bench balance --help
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from hetero_strategy.commands.flags import UsageError

NAME = "bench"
HELP = ("Run a benchmark: compression (hooks on a slow link), balance (batch split on mixed devices), "
        "accelerate (the plugin's overhead), overlap (pipelined Top-K) lengths (dealing text by cost), soak (a flapping link), hybrid (local-SGD phases) or plan (the planner against the emulator).")

__all__ = ["CHECKOUT", "HELP", "MODES", "NAME", "NOT_IN_CHECKOUT", "add_arguments", "benchmarks_dir", "run"]

# sub-mode -> one-line help; the module is hetero_bench.<sub-mode, - as _> under the checkout's benchmarks/
MODES = {
    "compression": "dense fp32 vs fp16 vs PowerSGD vs Top-K vs tiered: step time, bytes, convergence",
    "compression-scaling": "bytes per rank per step of each codec at W = 2, 4, 8 (measured) and up to 1024 (model)",
    "balance": "capacity-sized batches vs plain DDP on an emulated heterogeneous cluster",
    "accelerate": "HeteroPlugin (equal shares) vs plain Accelerate DDP: the plugin's per-step overhead",
    "overlap": "pipelined Top-K: the codec against the exchange, overlap efficiency per stage count",
    "lengths": "variable-length samples dealt out by cost vs by count on a length-skewed text task",
    "soak": "a long calibrating run while one link flaps: throughput before, during and after; leaks",
    "hybrid": "local-SGD phases (mode='hybrid') vs synchronous hetero and Top-K: time to a target accuracy",
    "plan": "hetero-strategy plan's predicted step time and bytes per rank against the emulated clusters' measured",
}

# An editable install imports the package from <checkout>/src/hetero_strategy/; a wheel from site-packages.
CHECKOUT = Path(__file__).resolve().parents[3]  # src/hetero_strategy/commands/bench.py -> the checkout
NOT_IN_CHECKOUT = ("bench: the benchmarks are not part of the installed package; they run from a checkout: "
                   "clone the hetero_strategy repository, run `make install` there, then `hetero-strategy bench MODE`")


def benchmarks_dir() -> Path | None:
    """The checkout's ``benchmarks/`` folder when this package runs from one, else None."""
    folder = CHECKOUT / "benchmarks"
    return folder if (folder / "hetero_bench" / "__init__.py").is_file() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    folder = benchmarks_dir()
    if folder is None:  # a wheel: take any arguments, so that run() can say where the benchmarks are
        parser.add_argument("bench_mode", nargs="?", metavar="MODE",
                            help="; ".join(f"{m}: {h}" for m, h in MODES.items()).replace("%", "%%"))
        parser.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        parser.set_defaults(_bench_error=NOT_IN_CHECKOUT)
        return
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    sub = parser.add_subparsers(dest="bench_mode", metavar="MODE")
    for mode, help_text in MODES.items():
        p = sub.add_parser(mode, help=help_text, description=help_text)
        try:
            module = importlib.import_module(f"hetero_bench.{mode.replace('-', '_')}")
        except ImportError as e:  # NOTE: e.g. without the recipes extra; keep --help and the other modes working
            p.set_defaults(_bench_error=f"bench {mode} is not available: {e}")
            continue
        module.add_arguments(p)
        p.set_defaults(_bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "_bench_error", None):
        print(args._bench_error)
        return 2
    if not getattr(args, "_bench_run", None):
        print("choose a benchmark: " + ", ".join(MODES) + " (hetero-strategy bench MODE --help)")
        return 2
    try:
        return int(args._bench_run(args) or 0)
    except UsageError as e:  # flags that do not fit together (--compute and --link): as argparse, exit 2
        print(f"bench {args.bench_mode}: {e}")
        return 2
