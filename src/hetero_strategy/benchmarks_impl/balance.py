"""``hetero-strategy bench balance``: plain DDP vs ``strategy="hetero"`` on an emulated 2-rank cluster.

One run, alternating: each round launches (on the same emulated cluster) the solo/all-reduce probe,
then plain Lightning ``"ddp"``, ``"hetero"`` with the static probe and ``"hetero"`` with online
calibration from equal shares; odd rounds run the three trainings in reverse order, so drift in the
machine's load does not favour one of them. Figures are medians over rounds (definitions in
:mod:`hetero_strategy.benchmarks_impl.balance_metrics`). Workload: torchvision ResNet-18 on sklearn
digits upsampled to 32x32, batch B per rank.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench balance --json benchmarks/results/balance.json
    hetero-strategy bench balance --simulate --rounds 1 --steps 20   # without root (labelled simulated)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "goals", "run"]

_WORKER = "hetero_strategy.benchmarks_impl.balance_worker"
_TRAININGS = ("ddp", "hetero", "hetero_cal")
# Issue 3's goals, for the static probe and for calibration from equal shares (idle: at most).
_GOALS = {"throughput_vs_ideal": 0.95, "speedup_vs_ddp": 1.3, "fast_rank_idle_fraction_hetero": 0.05,
          "throughput_vs_ideal_calibrated": 0.95, "speedup_vs_ddp_calibrated": 1.3,
          "fast_rank_idle_fraction_hetero_calibrated": 0.05}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="benchmarks/results/balance.json", help="result JSON (PNG beside it)")
    parser.add_argument("--png", default=None, help="chart path (default: the JSON path with .png)")
    parser.add_argument("--compute", default="1.0,0.57", help="per-rank CPU share (default 1.0,0.57)")
    parser.add_argument("--link", default="10gbit", help="per-rank link rate (default 10gbit: compute dominates)")
    parser.add_argument("--batch", type=int, default=128, help="mean per-rank batch B (default 128)")
    parser.add_argument("--steps", type=int, default=30, help="training steps of ddp / static hetero runs")
    parser.add_argument("--cal-steps", type=int, default=60, help="steps of the calibrated run (from equal shares)")
    parser.add_argument("--measure", type=int, default=12, help="figures use the last N steps of each run")
    parser.add_argument("--recalibrate-every", type=int, default=10, help="calibrator period in the bench")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--simulate", action="store_true", help="no root: loopback + duty-cycle compute")
    parser.add_argument("--overlap-comm", choices=("on", "off"), default="on",
                        help="hetero runs' overlap_comm: on = all-reduce during backward (DDP's way, the "
                             "default), off = after it")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per launch")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.emulate import EmulatedCluster, EmulatorError
    from hetero_strategy.emulate.report import cluster_table
    from hetero_strategy.emulate.spec import parse_float_list, parse_link_list

    console = Console()
    compute = parse_float_list(args.compute, "--compute")
    if args.measure >= args.steps or args.cal_steps - args.measure < 5 + 3 * args.recalibrate_every:
        console.print("[red]bench balance: --measure must be below --steps, and --cal-steps must leave room for "
                      "three calibration decisions before the measured steps")
        return 2
    rounds = []
    try:
        with EmulatedCluster(compute, parse_link_list(args.link), simulate=args.simulate) as cluster, \
                tempfile.TemporaryDirectory(prefix="bench_balance_") as tmp:
            console.print(cluster_table(cluster.describe()))
            for i in range(args.rounds):
                order = _TRAININGS if i % 2 == 0 else tuple(reversed(_TRAININGS))
                raw = {m: _launch(cluster, m, args, Path(tmp, f"round{i}"), console) for m in ("solo", *order)}
                rounds.append(_round(raw, args))
                console.print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                    f"{m} {rounds[-1][f'{m}_samples_per_s']:.0f}/s" for m in _TRAININGS) +
                    f", ideal {rounds[-1]['ideal_samples_per_s']:.0f}/s")
            description = cluster.describe()
    except (EmulatorError, RuntimeError) as e:
        console.print(f"[red]bench balance: {e}")
        return 1
    result = _summarise(rounds, args, description, "simulated" if args.simulate else "namespaces")
    _write(result, args, console)
    return 0


def _launch(cluster: Any, mode: str, args: argparse.Namespace, out: Path, console: Any) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    steps = args.cal_steps if mode == "hetero_cal" else args.steps
    cmd = [sys.executable, "-m", _WORKER, "--mode", mode, "--out", str(out), "--batch", str(args.batch),
           "--steps", str(steps), "--recalibrate-every", str(args.recalibrate_every)]
    cmd += ["--overlap-comm", args.overlap_comm]
    res = cluster.run(cmd, timeout=args.timeout)
    if not res.ok:
        tail = "\n".join(f"--- rank {k} ---\n{o[-2500:]}" for k, o in enumerate(res.outputs))
        raise RuntimeError(f"{mode} run failed (exit codes {res.returncodes}, timed out {res.timed_out}):\n{tail}")
    console.print(f"  {mode}: {res.wall_s:.1f} s")
    return [json.loads(Path(out, f"{mode}_r{k}.json").read_text()) for k in range(len(res.returncodes))]


def _round(raw: dict[str, list[dict]], args: argparse.Namespace) -> dict[str, Any]:
    from hetero_strategy.benchmarks_impl.balance_metrics import mode_figures, round_figures, solo_figures

    solo = solo_figures(raw["solo"], args.batch)
    modes = {m: mode_figures(raw[m], solo, args.measure) for m in _TRAININGS}
    return round_figures(solo, modes, args.batch * len(raw["solo"]))


def _summarise(rounds: list[dict], args: argparse.Namespace, description: list[dict], emulation: str) -> dict:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    result: dict[str, Any] = {
        "benchmark": "balance", "emulation": emulation, "cluster": description,
        "config": {"compute": args.compute, "link": args.link, "batch_per_rank": args.batch, "steps": args.steps,
                   "cal_steps": args.cal_steps, "measure_last": args.measure, "rounds": args.rounds,
                   "recalibrate_every": args.recalibrate_every, "overlap_comm": args.overlap_comm,
                   "workload": "torchvision resnet18 (7x7/2 stem), sklearn digits upsampled to 32x32"},
        "global_batch": args.batch * len(description),
        "solo_samples_per_s": [statistics.median(r["solo_samples_per_s"][k] for r in rounds)
                               for k in range(len(description))],
        "t_ar_s": med("t_ar_s"), "ideal_samples_per_s": med("ideal_samples_per_s"),
        "ddp_samples_per_s": med("ddp_samples_per_s"), "hetero_samples_per_s": med("hetero_samples_per_s"),
        "hetero_cal_samples_per_s": med("hetero_cal_samples_per_s"),
        "throughput_vs_ideal": med("hetero_vs_ideal"), "throughput_vs_ideal_calibrated": med("hetero_cal_vs_ideal"),
        "ddp_vs_ideal": med("ddp_vs_ideal"),
        "speedup_vs_ddp": med("hetero_speedup_vs_ddp"), "speedup_vs_ddp_calibrated": med("hetero_cal_speedup_vs_ddp"),
        "fast_rank_idle_fraction_ddp": med("fast_rank_idle_fraction_ddp"),
        "fast_rank_idle_fraction_hetero": med("fast_rank_idle_fraction_hetero"),
        "fast_rank_idle_fraction_hetero_calibrated": med("fast_rank_idle_fraction_hetero_cal"),
        "fast_rank_idle_fraction_solo_estimate": {
            m: med(f"fast_rank_idle_fraction_{m}_solo_estimate") for m in _TRAININGS},
        "balance_ddp": med("balance_ddp"), "balance_hetero": med("balance_hetero"),
        "balance_hetero_calibrated": med("balance_hetero_cal"),
        "batch_sizes": {m: rounds[-1]["modes"][m]["batch_sizes"] for m in _TRAININGS},
        "calibration_decisions": rounds[-1]["modes"]["hetero_cal"].get("decisions"),
        "rounds": rounds,
    }
    result["goals"] = goals(result)
    return result


def goals(result: dict) -> dict[str, dict]:
    return {k: {"goal": v, "value": result[k], "met": result[k] >= v if "idle" not in k else result[k] <= v}
            for k, v in _GOALS.items()}


def _write(result: dict, args: argparse.Namespace, console: Any) -> None:
    from rich.table import Table

    from hetero_strategy.benchmarks_impl.balance_chart import balance_chart

    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = args.png or str(path.with_suffix(".png"))
    result["png"] = png
    result["command"] = " ".join(sys.argv)
    path.write_text(json.dumps(result, indent=2))
    balance_chart(result, png)
    tag = " [bold red](SIMULATED)" if result["emulation"] == "simulated" else ""
    table = Table(title=f"bench balance: compute {args.compute}, link {args.link}, B={args.batch}{tag}")
    for col in ("mode", "samples/s", "vs ideal", "vs DDP", "fast-rank idle", "balance", "batch sizes"):
        table.add_column(col, justify="left" if col in ("mode", "batch sizes") else "right")
    table.add_row("ideal", f"{result['ideal_samples_per_s']:.0f}", "1.00", "", "", "", "")
    for m, suffix in (("ddp", "ddp"), ("hetero", "hetero"), ("hetero_cal", "hetero_calibrated")):
        sps = result[f"{m}_samples_per_s"]
        table.add_row(m, f"{sps:.0f}", f"{sps / result['ideal_samples_per_s']:.2f}",
                      f"{sps / result['ddp_samples_per_s']:.2f}",
                      f"{result[f'fast_rank_idle_fraction_{suffix}']:.1%}", f"{result[f'balance_{suffix}']:.2f}",
                      str(result["batch_sizes"][m]))
    console.print(table)
    console.print(f"solo samples/s {[round(s) for s in result['solo_samples_per_s']]}, t_ar {result['t_ar_s']:.3f} s; "
                  f"wrote {path} and {png}")
