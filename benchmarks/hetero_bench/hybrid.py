"""``hetero-strategy bench hybrid``: local-SGD phases against synchronous training, to a target accuracy.

Two ranks on the emulated cluster (default: a 1.75x compute gap, 1.0 and 0.57 of a core, on
100 Mbit/s links) train a small CNN on sklearn's digits for the same number of epochs in four
modes, every mode x seed in turn in one launch (:mod:`.hybrid_worker`):

* ``sync``: synchronous hetero (capacity-sized batches, dense weighted all-reduce);
* ``sync_topk``: the same with ``compression="topk"``;
* ``hybrid``: ``mode="hybrid"`` with capacity-sized batches (the ranks' step counts stay close);
* ``hybrid_equal``: ``mode="hybrid"`` with equal batches (the fast rank takes more local steps).

Figures per mode: the training time to the target held-out accuracy (median over seeds, with
min and max) and the accuracy after the last epoch. Ratios are paired by seed: seed s of one
mode against seed s of another. Writes JSON and a PNG of accuracy against training time.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench hybrid --json benchmarks/results/hybrid.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from hetero_bench import RESULTS
from hetero_bench._ranks import run_job, worker
from hetero_strategy.commands.flags import add_cluster_flags, cluster_args, count, number, output_file

__all__ = ["add_arguments", "run", "summarise"]

_WORKER = "hybrid_worker"
_BASELINES = ("sync", "sync_topk")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "hybrid.json"), help="result JSON (a PNG beside it)")
    add_cluster_flags(parser, link="100mbit")
    parser.add_argument("--seeds", type=count(1), default=3, help="seeds per mode (default 3)")
    parser.add_argument("--epochs", type=count(1), default=10, help="epochs per run (default 10)")
    parser.add_argument("--batch", type=count(1), default=32, help="mean samples per rank per step (default 32)")
    parser.add_argument("--target", type=number(0.0, 1.0, what="an accuracy"), default=0.95,
                        help="held-out accuracy to reach (default 0.95)")
    parser.add_argument("--modes", nargs="+", default=["sync", "sync_topk", "hybrid", "hybrid_equal"],
                        choices=["sync", "sync_topk", "hybrid", "hybrid_equal"], help="modes to run")
    parser.add_argument("--timeout", type=number(what="seconds"), default=1800.0, help="seconds allowed")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.emulate import EmulatedCluster, EmulatorError

    console = Console()
    compute, links = cluster_args(args.compute, args.link)
    t0 = time.monotonic()
    try:
        with EmulatedCluster(compute, links) as cluster, tempfile.TemporaryDirectory(prefix="hetero_hybrid_") as tmp:
            cmd = [*worker(_WORKER), tmp, "--modes", *args.modes, "--seeds", str(args.seeds), "--epochs", str(args.epochs),
                   "--batch", str(args.batch), "--capacities", ",".join(f"{c:g}" for c in compute)]
            ranks = run_job(cluster, cmd, ["hybrid"], Path(tmp), args.timeout, console, "hybrid")["hybrid"]
            emulation = cluster.mode
    except (EmulatorError, RuntimeError) as e:
        console.print(f"[red]bench hybrid: {e}")
        return 1
    result = {"setup": {"compute": compute, "links": links, "seeds": args.seeds, "epochs": args.epochs,
                        "batch": args.batch, "target": args.target, "emulation": emulation,
                        "wall_s": time.monotonic() - t0},
              **summarise(ranks[0], args.target)}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    _chart(result, str(path.with_suffix(".png")))
    for m, fig in result["modes"].items():
        console.print(f"  {m:>12}: to {args.target:.0%} in {_fmt(fig['time_to_target_s'])} s "
                      f"{fig['time_to_target_per_seed_s']}, final accuracy {fig['accuracy']:.3f}")
    for name, value in result["ratios"].items():
        console.print(f"  {name}: {_fmt(value)}")
    console.print(f"bench hybrid: wrote {path} and {path.with_suffix('.png')}")
    return 0


def time_to_target(curve: list, target: float) -> float | None:
    """Training seconds at the first evaluation at or above ``target`` (None: never reached)."""
    return next((t for _, acc, t in curve if acc >= target), None)


def summarise(runs: dict[str, list[dict]], target: float) -> dict:
    """Per mode: time to target (median, spread, per seed) and final accuracy; paired ratios."""
    modes = {}
    for m, seeds in runs.items():
        reached = [time_to_target(r["curve"], target) for r in seeds]
        done = [t for t in reached if t is not None]
        modes[m] = {"time_to_target_s": statistics.median(done) if len(done) == len(reached) else None,
                    "time_to_target_spread_s": [min(done), max(done)] if done else None,
                    "time_to_target_per_seed_s": reached,
                    "accuracy": statistics.mean(r["accuracy"] for r in seeds),
                    "accuracy_per_seed": [r["accuracy"] for r in seeds],
                    "train_s": statistics.median(r["train_s"] for r in seeds),
                    "phase_switches_per_seed": [r["phases"] for r in seeds],
                    "batch_sizes": seeds[0]["batch_sizes"], "curves": [r["curve"] for r in seeds]}
    ratios = {}
    for cand in (m for m in runs if m.startswith("hybrid")):
        for base in (b for b in _BASELINES if b in runs):
            pairs = [b / c for b, c in zip(modes[base]["time_to_target_per_seed_s"],
                                           modes[cand]["time_to_target_per_seed_s"], strict=True)
                     if b is not None and c is not None]
            ratios[f"{cand}_speedup_vs_{base}"] = statistics.median(pairs) if pairs else None
            ratios[f"{cand}_speedup_vs_{base}_per_seed"] = pairs
            ratios[f"{cand}_accuracy_minus_{base}"] = modes[cand]["accuracy"] - modes[base]["accuracy"]
    return {"modes": modes, "ratios": ratios}


def _fmt(v: object) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _chart(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"sync": "#d62728", "sync_topk": "#ff7f0e", "hybrid": "#2ca02c", "hybrid_equal": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for m, fig_m in result["modes"].items():
        for k, curve in enumerate(fig_m["curves"]):
            ax.plot([t for _, _, t in curve], [a for _, a, _ in curve], color=colours.get(m, "#7f7f7f"),
                    alpha=0.85 if k == 0 else 0.35, label=m if k == 0 else None)
    setup = result["setup"]
    ax.axhline(setup["target"], color="#999999", linestyle="--", linewidth=1)
    ax.set_xlabel("training time, s (evaluation excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0.5, 1.0)
    tag = " [SIMULATED]" if setup["emulation"] == "simulated" else ""
    ax.set_title(f"digits CNN, compute {setup['compute']}, links {setup['links']}, {setup['seeds']} seeds{tag}",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
