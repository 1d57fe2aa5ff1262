"""``hetero-strategy bench accelerate``: HeteroPlugin with equal shares vs plain Accelerate DDP.

The plugin's overhead, measured as the issue asks: the same loop, the same data and model, on
2 CPU ranks started by ``accelerate launch`` (``ACCELERATE_USE_CPU=true ... --multi_gpu``), once
through plain ``accelerator.prepare`` and once through ``HeteroPlugin(batch_sizes=[B, B])``.
Rounds alternate the order (plain first on even rounds, hetero first on odd ones); each run
reports the median of its step times, and the figure is the per-round ratio hetero / plain,
summarised as median and spread. Models: torchvision ResNet-18 on digits at 32x32 (a real
workload) and a small MLP (the worst case: least compute to hide a per-step cost behind).

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench accelerate --json benchmarks/results/accelerate_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hetero_bench import RESULTS
from hetero_bench._ranks import worker
from hetero_strategy.commands.flags import choices_list, count, number, output_file
from hetero_strategy.emulate.launch import die_with_parent

__all__ = ["add_arguments", "run"]

_WORKER = "accelerate_worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "accelerate_overhead.json"), help="result JSON")
    parser.add_argument("--models", type=choices_list(("resnet18", "mlp")), default="resnet18,mlp", help="comma-separated: resnet18, mlp")
    parser.add_argument("--batch", type=count(1), default=32, help="per-rank batch B (default 32)")
    parser.add_argument("--steps", type=count(1), default=30, help="timed steps per run (after one untimed)")
    parser.add_argument("--rounds", type=count(1), default=5, help="alternating rounds (default 5)")
    parser.add_argument("--timeout", type=number(what="seconds"), default=600.0, help="seconds allowed per launch")


def _launch(mode: str, model: str, args: argparse.Namespace, out: Path) -> list[float]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
           *worker(_WORKER)[1:], mode, model, str(args.steps), str(args.batch), str(out)]
    env = dict(os.environ, ACCELERATE_USE_CPU="true", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=die_with_parent)  # noqa: PLW1509
    try:
        log, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{mode}/{model} did not finish within {args.timeout:.0f} s") from None
    finally:
        if proc.poll() is None:  # a timeout, or SIGTERM/SIGINT/SIGHUP of the bench: the launcher and both ranks
            os.killpg(proc.pid, 9)
            proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode}/{model} failed ({proc.returncode}):\n{log[-3000:]}")
    return json.loads(out.read_text())["step_s"]


def _summary(rounds: list[dict], batch: int) -> dict:
    ratios = [r["hetero_step_s"] / r["plain_step_s"] for r in rounds]
    plain = [2 * batch / r["plain_step_s"] for r in rounds]
    hetero = [2 * batch / r["hetero_step_s"] for r in rounds]
    return {
        "plain_samples_per_s_median": statistics.median(plain),
        "hetero_samples_per_s_median": statistics.median(hetero),
        "step_time_ratio_median": statistics.median(ratios),
        "step_time_ratio_min": min(ratios),
        "step_time_ratio_max": max(ratios),
        "overhead_median": statistics.median(ratios) - 1.0,
    }


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    result: dict = {"benchmark": "accelerate_overhead", "world_size": 2, "batch_per_rank": args.batch,
                    "steps": args.steps, "rounds": args.rounds, "runs": {m: [] for m in models}}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for model in models:
                order = ("plain", "hetero") if i % 2 == 0 else ("hetero", "plain")
                row: dict = {"round": i, "order": list(order)}
                for mode in order:
                    times = _launch(mode, model, args, Path(tmp) / f"{mode}.json")
                    row[f"{mode}_step_s"] = statistics.median(times)
                console.print(f"round {i} {model}: plain {row['plain_step_s'] * 1000:.1f} ms, "
                              f"hetero {row['hetero_step_s'] * 1000:.1f} ms per step")
                result["runs"][model].append(row)
    result["summary"] = {m: _summary(result["runs"][m], args.batch) for m in models}
    table = Table(title=f"HeteroPlugin (equal shares) vs plain Accelerate DDP, 2 CPU ranks, {args.rounds} rounds")
    for col in ("model", "plain samples/s", "hetero samples/s", "step time hetero/plain (median, min-max)"):
        table.add_column(col)
    for m, s in result["summary"].items():
        table.add_row(m, f"{s['plain_samples_per_s_median']:.0f}", f"{s['hetero_samples_per_s_median']:.0f}",
                      f"{s['step_time_ratio_median']:.3f} ({s['step_time_ratio_min']:.3f}-"
                      f"{s['step_time_ratio_max']:.3f})")
    console.print(table)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.json}")
    return 0
