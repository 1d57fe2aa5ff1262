"""``hetero-strategy profile``: measure every rank's compute and links; write a cluster-profile JSON.

Example::

    hetero-strategy profile --json cluster.json                        # single process
    torchrun --nproc-per-node 4 -m hetero_strategy.cli profile --json cluster.json
    hetero-strategy emulate --compute 1.0,0.57 --link 10gbit,100mbit -- \\
        hetero-strategy profile --max-bytes 4MB --json cluster.json
"""

from __future__ import annotations

import argparse

from hetero_strategy.commands.flags import count, number, output_file

NAME = "profile"
HELP = "Measure per-rank matmul/memory throughput and all-reduce/p2p bandwidth; write a cluster profile."

__all__ = ["HELP", "NAME", "add_arguments", "run"]


def _bytes(text: str) -> int:
    from hetero_strategy.cluster.tiers import parse_size

    try:
        size = parse_size(text)
    except ValueError:
        size = 0
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: give a positive size such as 4096, 64KB or 4MB")
    return size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=None,
                        help="write the cluster profile here (rank 0); checked before the probes start")
    parser.add_argument("--max-bytes", type=_bytes, default=256 << 20,
                        help="largest all-reduce of the sweep (1 KB .. this; default 256MB); e.g. 4MB on CPU")
    parser.add_argument("--p2p-bytes", type=_bytes, default=4 << 20, help="bytes per point-to-point transfer")
    parser.add_argument("--matmul-n", type=count(16), default=1024, help="matrix size of the matmul probe")
    parser.add_argument("--budget", type=number(what="seconds"), default=0.3, help="seconds per timed probe")
    parser.add_argument("--model", default=None,
                        help="also time this model's training step on every rank (a `hetero-strategy plan` model "
                             "name or module:callable): `plan` then rates the ranks from it, not from TFLOP/s")
    parser.add_argument("--model-batch", type=count(2), default=32, help="--model: samples per step (and half)")


def run(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console

    from hetero_strategy.cluster.profile import run_profile, save_profile
    from hetero_strategy.cluster.report import profile_tables

    extra = None
    if args.model:
        from hetero_strategy.balance.model_step import measure_model_step
        from hetero_strategy.cluster.model import model_builder
        from hetero_strategy.config import ConfigError

        try:  # before the probes: a model that cannot be imported is refused at once
            model_builder(args.model)
        except ConfigError as e:
            print(f"profile: {e}")
            return 2

        def extra() -> dict:
            return {"model_step": measure_model_step(args.model, args.model_batch)}
    profile = run_profile(max_bytes=args.max_bytes, p2p_bytes=args.p2p_bytes, matmul_n=args.matmul_n,
                          budget_s=args.budget, extra=extra)
    if os.environ.get("RANK", "0") != "0":  # rank 0 reports; the others only took part in the probes
        return 0
    console = Console()
    for table in profile_tables(profile):
        console.print(table)
    if args.json:
        save_profile(profile, args.json)
        console.print(f"profile: wrote {args.json}")
    return 0
