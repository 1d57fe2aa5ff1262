"""``hetero-strategy bench``: benchmarks, one sub-mode each (``compression``, ``balance``).

Each sub-mode lives in ``hetero_strategy.benchmarks_impl.<mode>`` (imported lazily, so one missing
or slow-to-import benchmark never breaks the others) and exposes ``add_arguments`` and ``run``.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench compression --json benchmarks/results/compression.json
    hetero-strategy bench balance --help
"""

from __future__ import annotations

import argparse
import importlib

NAME = "bench"
HELP = ("Run a benchmark: compression (hooks on a slow link), balance (batch split on mixed devices), "
        "accelerate (the plugin's overhead), overlap (pipelined Top-K) lengths (dealing text by cost), soak (a flapping link) or hybrid (local-SGD phases).")

__all__ = ["HELP", "MODES", "NAME", "add_arguments", "run"]

# sub-mode -> one-line help; the module is hetero_strategy.benchmarks_impl.<sub-mode>
MODES = {
    "compression": "dense fp32 vs fp16 vs PowerSGD vs Top-K vs tiered: step time, bytes, convergence",
    "balance": "capacity-sized batches vs plain DDP on an emulated heterogeneous cluster",
    "accelerate": "HeteroPlugin (equal shares) vs plain Accelerate DDP: the plugin's per-step overhead",
    "overlap": "pipelined Top-K: the codec against the exchange, overlap efficiency per stage count",
    "lengths": "variable-length samples dealt out by cost vs by count on a length-skewed text task",
    "soak": "a long calibrating run while one link flaps: throughput before, during and after; leaks",
    "hybrid": "local-SGD phases (mode='hybrid') vs synchronous hetero and Top-K: time to a target accuracy",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_mode", metavar="MODE")
    for mode, help_text in MODES.items():
        p = sub.add_parser(mode, help=help_text, description=help_text)
        try:
            module = importlib.import_module(f"hetero_strategy.benchmarks_impl.{mode}")
        except ImportError as e:  # NOTE: the balance bench is written separately; keep --help working
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
    return int(args._bench_run(args) or 0)
