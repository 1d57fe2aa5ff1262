"""``hetero-strategy bench balance``: plain DDP vs ``strategy="hetero"`` on an emulated cluster.

One run, alternating: each round launches (on the same emulated cluster) the solo/all-reduce probe,
then each training of ``--trainings`` (default: plain Lightning ``"ddp"``, ``"hetero"`` with the
static probe and ``"hetero"`` with online calibration from equal shares); odd rounds run them in
reverse order, so drift in the machine's load does not favour one of them. ``--sweep`` adds fixed
splits around the first round's plans (:func:`~hetero_bench.balance_summary.sweep_anchor`): every
round ends with one launch in which they, plain DDP and the splits this round's trainings ended
on take turns in blocks of 3 steps (:mod:`hetero_bench.balance_cycle`). The best swept split is
the best split this machine achieves, and each training's split is judged against it within the
same cycle. Figures are medians over rounds with their spread (definitions in
:mod:`hetero_bench.balance_metrics`).
Workload: torchvision ResNet-18 (or ``--model resnet18_l3``, without layer4) on sklearn digits
upsampled to 32x32, batch B per rank.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench balance --rounds 5 --sweep   # 2 ranks, 1.0 / 0.57 of a core
    # 4 ranks, balance alone
    flock /tmp/hetero_cpu.lock hetero-strategy bench balance --compute 0.5,0.45,0.3,0.25 --batch 32 \
        --model resnet18_l3 --framework ddp --trainings ddp,hetero --json benchmarks/results/balance_4rank.json
    # 4 ranks, mixed links: hetero + tiered against DDP and DDP + PowerSGD
    flock /tmp/hetero_cpu.lock hetero-strategy bench balance --compute 0.5,0.45,0.3,0.25 \
        --link 10gbit,10gbit,1gbit,100mbit --batch 32 --model resnet18_l3 \
        --framework ddp --trainings ddp,ddp_powersgd,hetero_tiered --steps 12 \
        --json benchmarks/results/balance_4rank_mixed.json
    hetero-strategy bench balance --simulate --rounds 1 --steps 20   # without root (labelled simulated)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetero_bench import RESULTS
from hetero_bench._ranks import run_job, worker
from hetero_bench.balance_summary import (
    FRAMEWORKS,
    MODELS,
    TRAININGS,
    goals,
    summarise,
    sweep_anchor,
    sweep_splits,
)
from hetero_strategy.commands.flags import add_cluster_flags, cluster_args, count, number, output_file

__all__ = ["add_arguments", "goals", "run"]

_WORKER = "balance_worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "balance.json"), help="result JSON (PNG beside it)")
    parser.add_argument("--png", default=None, help="chart path (default: the JSON path with .png)")
    add_cluster_flags(parser, link_why=": compute dominates")
    parser.add_argument("--batch", type=count(1), default=64, help="mean per-rank batch B (default 64)")
    parser.add_argument("--model", choices=MODELS, default="resnet18", help="workload model (default resnet18)")
    parser.add_argument("--framework", choices=FRAMEWORKS, default="lightning",
                        help="lightning: L.Trainer + HeteroStrategy (default); ddp: torch DDP + HeteroRuntime "
                             "(starts in a fraction of the time: for 4+ ranks on few cores)")
    parser.add_argument("--trainings", default="ddp,hetero,hetero_cal",
                        help=f"comma-separated trainings to compare, from {', '.join(TRAININGS)}")
    parser.add_argument("--sweep", action="store_true",
                        help="also measure fixed splits around the first round's plan that leans most, with plain "
                             "DDP and the trainings' splits, taking turns in one launch per round")
    # NOTE: around the first round's plan that leans most (static or calibrated: sweep_anchor), and wide
    # on the far side: one noisy probe planned [76, 52] where later rounds and the calibrated run went
    # to [93, 35]..[97, 31] on 1.0 / 0.57 of a core, and a 5-point sweep about it never reached the best;
    # and wide on the near side: at e64f261 a probe planned ~[108, 20], and the best, [86, 42], was
    # the sweep's alpha 0.5, its edge
    parser.add_argument("--sweep-points", default="0.25,0.5,0.75,1.0,1.25,1.5,1.8",
                        help="the sweep's splits: equal + a * (plan - equal) for each a, the plan being the "
                             "first round's static or calibrated one, whichever leans more (default "
                             "0.25,0.5,0.75,1.0,1.25,1.5,1.8)")
    parser.add_argument("--cycle-blocks", type=count(1), default=4,
                        help="--sweep: blocks of 3 steps per split and round, splits taking turns (default 4)")
    parser.add_argument("--steps", type=count(2), default=20, help="training steps of ddp / static hetero runs")
    # NOTE: from equal shares a move is at most max_change (15%) per decision: [64, 64] reaches [94, 34]
    # in 4 decisions; 50 steps left the last one inside the measured window
    parser.add_argument("--cal-steps", type=count(2), default=90, help="steps of the calibrated run (from equal shares)")
    parser.add_argument("--measure", type=count(1), default=10, help="figures use the last N steps of each run")
    parser.add_argument("--recalibrate-every", type=count(1), default=10, help="calibrator period in the bench")
    parser.add_argument("--rounds", type=count(1), default=5, help="alternating rounds (default 5)")
    parser.add_argument("--simulate", action="store_true", help="no root: loopback + duty-cycle compute")
    parser.add_argument("--overlap-comm", choices=("on", "off"), default="on",
                        help="hetero runs' overlap_comm: on = all-reduce during backward (DDP's way, the "
                             "default), off = after it")
    parser.add_argument("--sharded", action="store_true",
                        help="FSDP2: plain (even batches) vs hetero_fsdp, then with the slow rank's memory limited "
                             "(2 ranks, compute 1.0/0.57; hetero_bench/sharded.py)")
    parser.add_argument("--size", type=count(8), default=96, help="--sharded: image side of the conv workload")
    parser.add_argument("--memory-margin", type=float, default=0.03, help="--sharded: hetero_fsdp's memory_margin")
    parser.add_argument("--timeout", type=number(what="seconds"), default=900.0,
                        help="seconds allowed per run (a --framework ddp launch gets this per mode it runs)")


def _check(args: argparse.Namespace) -> tuple[list[str], list[float]] | str:
    trainings = [t.strip() for t in args.trainings.split(",") if t.strip()]
    bad = [t for t in trainings if t not in TRAININGS]
    if bad or not trainings or len(set(trainings)) != len(trainings):
        return f"--trainings={args.trainings!r} is invalid: give distinct names from {', '.join(TRAININGS)}"
    if args.sweep and "hetero" not in trainings:
        return "--sweep needs the static plan: include hetero in --trainings"
    if "ddp_powersgd" in trainings and args.framework != "ddp":
        # NOTE: Lightning's DDPStrategy registers ddp_comm_hook on CUDA only: on CPU it would
        # silently measure dense DDP under the PowerSGD name
        return "--trainings ddp_powersgd needs --framework ddp (Lightning registers DDP comm hooks on CUDA only)"
    try:
        alphas = [float(a) for a in args.sweep_points.split(",")]
    except ValueError:
        alphas = []
    if not alphas or not all(math.isfinite(a) and a >= 0 for a in alphas):
        return f"--sweep-points={args.sweep_points!r} is invalid: give numbers >= 0 such as 0.8,0.9,1.0,1.1,1.2"
    cal = any(t in ("hetero_cal", "hetero_auto") for t in trainings)
    if args.measure >= args.steps or (cal and args.cal_steps - args.measure < 5 + 3 * args.recalibrate_every):
        return ("--measure must be below --steps, and --cal-steps must leave room for three calibration "
                "decisions before the measured steps")
    return trainings, alphas


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from hetero_strategy.emulate import EmulatedCluster, EmulatorError
    from hetero_strategy.emulate.report import cluster_table
    console = Console()
    if args.sharded:
        from hetero_bench.sharded import run as run_sharded

        return run_sharded(args)
    checked = _check(args)
    if isinstance(checked, str):
        console.print(f"bench balance: {checked}", style="red", markup=False, highlight=False)
        return 2
    compute, links = cluster_args(args.compute, args.link)
    trainings, alphas = checked
    started = time.perf_counter()
    rounds: list[dict] = []
    splits: list[list[int]] = []
    try:
        with EmulatedCluster(compute, links, simulate=args.simulate) as cluster, \
                tempfile.TemporaryDirectory(prefix="bench_balance_") as tmp:
            console.print(cluster_table(cluster.describe()))
            for i in range(args.rounds):
                out = Path(tmp, f"round{i}")
                # bare DDP runs a round's solo and trainings one after another in one launch (one
                # start-up, which costs a quarter-core rank most of a minute); Lightning needs one
                # launch each. Odd rounds run the trainings in reverse order.
                order = trainings if i % 2 == 0 else trainings[::-1]
                if args.framework == "ddp":
                    raw, groups = {}, [["solo", *order]]
                else:
                    raw, groups = _launch(cluster, ["solo"], args, out / "solo", console), [[m] for m in trainings]
                for j, modes in enumerate(groups if i % 2 == 0 else groups[::-1]):
                    raw.update(_launch(cluster, modes, args, out / f"job{j}", console))
                if args.sweep:
                    if not splits:  # round 0: the sweep is laid on its plans
                        splits = sweep_splits(sweep_anchor([_plan(raw[m]) for m in ("hetero", "hetero_cal")
                                                            if m in raw]), alphas)
                    raw["cycle"] = _cycle(cluster, _arms(raw, trainings, splits), args, out / "cycle", console)
                rounds.append(_round(raw, trainings, splits, args))
                console.print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                    f"{m} {rounds[-1][f'{m}_samples_per_s']:.0f}/s" for m in trainings) +
                    "".join(f", {p['sizes']} {p['samples_per_s']:.0f}/s" for p in rounds[-1].get("sweep", [])) +
                    f", ideal {rounds[-1]['ideal_samples_per_s']:.0f}/s")
            description = cluster.describe()
    except (EmulatorError, RuntimeError) as e:
        console.print(f"[red]bench balance:[/red] {escape(str(e))}")  # gloo errors hold [brackets]
        return 1
    result = summarise(rounds, trainings, _config(args), description, "simulated" if args.simulate else "namespaces")
    result["wall_s"] = time.perf_counter() - started  # the whole benchmark, cluster set-up included
    _write(result, args, console)
    return 0


def _plan(ranks: list[dict]) -> list[int]:
    return [int(b) for b in ranks[0]["final_sizes"]] if "final_sizes" in ranks[0] else [
        int(r["batches"][-1]) for r in ranks]


def _launch(cluster: Any, modes: list[str], args: argparse.Namespace, out: Path, console: Any,
            extra: tuple[str, ...] = ()) -> dict[str, list[dict]]:
    """One launch of the worker running ``modes`` in turn; every mode's per-rank records."""
    cmd = [*worker(_WORKER), "--mode", ",".join(modes), "--out", str(out), "--batch", str(args.batch),
           "--steps", str(args.steps), "--measure", str(args.measure), "--cal-steps", str(args.cal_steps),
           "--recalibrate-every", str(args.recalibrate_every), "--model", args.model,
           "--overlap-comm", args.overlap_comm, "--framework", args.framework, *extra]
    return run_job(cluster, cmd, modes, out, args.timeout * len(modes), console, ",".join(modes))


# the trainings whose split the cycle measures again: dense, so one fixed split stands for them
_SPLIT_TRAININGS = ("hetero", "hetero_cal", "hetero_auto")


def _arms(raw: dict[str, list[dict]], trainings: list[str], splits: list[list[int]]) -> list[list[int] | None]:
    """The cycle's arms: plain DDP (None) where it is a training, the split each of
    ``_SPLIT_TRAININGS`` ended on, and the sweep's; each once."""
    arms: list[list[int] | None] = [None] if "ddp" in trainings else []
    for sizes in [_plan(raw[m]) for m in _SPLIT_TRAININGS if m in trainings] + splits:
        if sizes not in arms:
            arms.append(sizes)
    return arms


def _cycle(cluster: Any, arms: list[list[int] | None], args: argparse.Namespace, out: Path,
           console: Any) -> list[dict]:
    """The arms in one bare-DDP launch, taking turns in blocks (:mod:`.balance_cycle`), whatever
    ``--framework``: the splits' figures come from one harness."""
    text = ";".join("ddp" if a is None else ",".join(map(str, a)) for a in arms)
    ddp = argparse.Namespace(**{**vars(args), "framework": "ddp"})
    ddp.timeout = args.timeout * len(arms)  # each arm steps about as long as one training
    got = _launch(cluster, ["cycle"], ddp, out, console,
                  ("--arms", text, "--blocks", str(args.cycle_blocks), "--block-steps", "3"))
    return got["cycle"][0]["arms"]


def _round(raw: dict[str, list[dict]], trainings: list[str], splits: list[list[int]],
           args: argparse.Namespace) -> dict[str, Any]:
    from hetero_bench.balance_metrics import cycle_figures, mode_figures, round_figures, solo_figures

    solo = solo_figures(raw["solo"], args.batch)
    modes = {m: mode_figures(raw[m], solo, args.measure) for m in trainings}
    out = round_figures(solo, modes, args.batch * len(raw["solo"]))
    if splits:  # measured in the cycle: each arm once, by its sizes (None: plain DDP)
        out["cycle"] = cycle_figures(raw["cycle"], args.batch * len(raw["solo"]))
        by = {str(a["sizes"]): a["samples_per_s"] for a in out["cycle"]}
        out["sweep"] = [{"sizes": s, "samples_per_s": by[str(s)]} for s in splits]
        for m in trainings:
            if m == "ddp" or m in _SPLIT_TRAININGS:
                out[f"{m}_split_samples_per_s"] = by[str(None if m == "ddp" else _plan(raw[m]))]
    return out


def _config(args: argparse.Namespace) -> dict[str, Any]:
    workload = {"resnet18": "torchvision resnet18 (7x7/2 stem)",
                "resnet18_l3": "torchvision resnet18 without layer4 (7x7/2 stem)"}[args.model]
    return {"compute": args.compute, "link": args.link, "batch_per_rank": args.batch, "steps": args.steps,
            "cal_steps": args.cal_steps, "measure_last": args.measure, "rounds": args.rounds,
            "recalibrate_every": args.recalibrate_every, "overlap_comm": args.overlap_comm, "model": args.model,
            "framework": args.framework, "trainings": args.trainings, "sweep_points": args.sweep_points if args.sweep else None,
            "workload": f"{workload}, sklearn digits upsampled to 32x32"}


def _write(result: dict, args: argparse.Namespace, console: Any) -> None:
    from rich.table import Table

    from hetero_bench.balance_chart import balance_chart
    from hetero_strategy.commands.provenance import source_commit

    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = args.png or str(path.with_suffix(".png"))
    result["png"] = png
    result["command"] = " ".join(sys.argv)
    result["commit"] = source_commit()
    path.write_text(json.dumps(result, indent=2))
    balance_chart(result, png)
    tag = " [bold red](SIMULATED)" if result["emulation"] == "simulated" else ""
    table = Table(title=f"bench balance: compute {args.compute}, link {args.link}, B={args.batch}{tag}")
    for col in ("mode", "samples/s", "vs ideal", "vs DDP", "fast-rank idle", "balance", "batch sizes"):
        table.add_column(col, justify="left" if col in ("mode", "batch sizes") else "right")
    table.add_row("ideal", f"{result['ideal_samples_per_s']:.0f}", "1.00", "", "", "", "")
    ddp = result.get("ddp_samples_per_s")
    for m in result["trainings"]:
        sps, spread = result[f"{m}_samples_per_s"], result["spread"][f"{m}_samples_per_s"]
        vs_ddp = "1.00" if m == "ddp" else f"{result[f'{m}_speedup_vs_ddp']:.2f}" if ddp else ""
        table.add_row(m, f"{sps:.0f} ({spread['min']:.0f}-{spread['max']:.0f})",
                      f"{sps / result['ideal_samples_per_s']:.2f}", vs_ddp,
                      f"{result[f'fast_rank_idle_fraction_{m}']:.1%}", f"{result[f'balance_{m}']:.2f}",
                      str(result["batch_sizes"][m]))
    for point in result.get("sweep", []):
        best = " (best)" if point["sizes"] == result["best_split"] else ""
        table.add_row(f"split{best}", f"{point['median']:.0f} ({point['min']:.0f}-{point['max']:.0f})",
                      f"{point['median'] / result['ideal_samples_per_s']:.2f}",
                      f"{point['median'] / ddp:.2f}" if ddp else "", "", "", str(point["sizes"]))
    console.print(table)
    for k, g in result["goals"].items():
        console.print(f"goal {k}: {g['value']:.3f} (goal {'<=' if 'idle' in k else '>='} {g['goal']}) "
                      f"{'[green]met' if g['met'] else '[red]not met'}")
    if result.get("best_split_at_sweep_edge"):
        console.print("[yellow]the best split is at the sweep's edge: widen --sweep-points to bracket it")
    console.print(f"solo samples/s {[round(s) for s in result['solo_samples_per_s']]}, t_ar {result['t_ar_s']:.3f} s; "
                  f"wrote {path} and {png}")
