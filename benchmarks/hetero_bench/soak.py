"""``hetero-strategy bench soak``: a long run on the emulated cluster while one rank's link flaps.

Two ranks of unequal speed train an MLP on digits with online calibration. When rank 0 reports
``--flap-at`` steps, the driver drops the last rank's link to ``--flap`` (``tc`` on the running
namespaces). At ``--restore-at`` it puts the link back. The figures are the median samples/s
and the split before, during and after the flap, and whether throughput recovered. After the
run they list every namespace, cgroup or rank process left behind (there must be none).

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench soak --json benchmarks/results/soak.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from hetero_bench import RESULTS
from hetero_bench._ranks import run_job, worker
from hetero_strategy.commands.flags import add_cluster_flags, cluster_args, count, number, output_file, rate

__all__ = ["add_arguments", "phases", "run"]

_WORKER = "soak_worker"
_SETTLE = 10  # steps after each link change left out of the figures (the step in flight, recalibration)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "soak.json"), help="result JSON")
    add_cluster_flags(parser, compute="1.0,0.5", link="1gbit")
    parser.add_argument("--flap", type=rate, default="50mbit", help="the last rank's link during the flap (default 50mbit)")
    parser.add_argument("--steps", type=count(30), default=300, help="training steps (default 300)")
    parser.add_argument("--flap-at", type=count(1), default=100, help="step the link drops at (default 100)")
    parser.add_argument("--restore-at", type=count(2), default=200, help="step it comes back at (default 200)")
    parser.add_argument("--batch", type=count(1), default=128, help="mean samples per rank per step (default 128)")
    parser.add_argument("--hidden", type=count(8), default=512, help="MLP width (default 512)")
    parser.add_argument("--timeout", type=number(what="seconds"), default=900.0, help="seconds allowed")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.emulate import EmulatedCluster, EmulatorError, leftovers

    console = Console()
    compute, links = cluster_args(args.compute, args.link)
    if not args.flap_at < args.restore_at < args.steps:
        console.print(f"[red]bench soak: --flap-at={args.flap_at} < --restore-at={args.restore_at} < "
                      f"--steps={args.steps} must hold")
        return 2
    flaps: dict[str, float] = {}
    try:
        with EmulatedCluster(compute, links) as cluster, tempfile.TemporaryDirectory(prefix="hetero_soak_") as tmp:
            stop = threading.Event()
            flapper = threading.Thread(target=_flap, args=(cluster, Path(tmp) / "progress", args, links[-1], flaps,
                                                           stop), daemon=True)
            flapper.start()
            cmd = [*worker(_WORKER), tmp, str(args.steps), str(args.batch), str(args.hidden)]
            t0 = time.monotonic()
            try:
                ranks = run_job(cluster, cmd, ["soak"], Path(tmp), args.timeout, console, "soak")["soak"]
            finally:
                stop.set()
                flapper.join(timeout=10)
            tag, wall = cluster.tag, time.monotonic() - t0
    except (EmulatorError, RuntimeError) as e:
        console.print(f"[red]bench soak: {e}")
        return 1
    left = [x for x in leftovers() if tag in x] + _live_workers()
    result = {"compute": compute, "links": links, "flap": args.flap, "steps": args.steps, "batch": args.batch,
              "flap_at": args.flap_at, "restore_at": args.restore_at, "flap_times": flaps, "wall_s": wall,
              **phases(ranks, args.flap_at, args.restore_at, args.batch * len(compute)), "leftovers": left}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    for name in ("before", "during", "after"):
        p = result[name]
        console.print(f"  {name:>6}: {p['samples_per_s']:.0f} samples/s (steps {p['steps'][0]}-{p['steps'][1]}), "
                      f"split {p['split']}")
    console.print(f"  recovered: {result['recovered']:.2f} of the throughput before; leftovers: {left or 'none'}")
    console.print(f"bench soak: wrote {args.json}")
    return 0 if not left else 1


def phases(ranks: list[dict], flap_at: int, restore_at: int, global_batch: int) -> dict:
    """Median samples/s and the split in force over the steps before, during and after the flap."""
    starts = ranks[0]["starts"]
    n = len(starts) - 1
    windows = {"before": (_SETTLE, flap_at), "during": (flap_at + _SETTLE, restore_at),
               "after": (restore_at + _SETTLE, n)}
    out: dict = {}
    for name, (a, b) in windows.items():
        steps = [starts[k + 1] - starts[k] for k in range(a, b)]
        out[name] = {"samples_per_s": global_batch / statistics.median(steps), "steps": [a, b],
                     "split": [r["batches"][b - 1] for r in ranks]}
    out["recovered"] = out["after"]["samples_per_s"] / out["before"]["samples_per_s"]
    return out


def _flap(cluster, progress: Path, args, link: str, flaps: dict, stop: threading.Event) -> None:
    """Drop the last rank's link at --flap-at steps and restore it at --restore-at (bounded polling)."""
    plan = [(args.flap_at, args.flap, "down"), (args.restore_at, link, "up")]
    deadline = time.monotonic() + args.timeout
    while plan and not stop.is_set() and time.monotonic() < deadline:
        try:
            done = int(progress.read_text() or 0)
        except (FileNotFoundError, ValueError):
            done = 0
        if done >= plan[0][0]:
            _, rate, name = plan.pop(0)
            cluster.set_link(len(cluster.spec.compute) - 1, rate)
            flaps[name] = time.time()
        stop.wait(0.05)


def _live_workers() -> list[str]:
    """Rank processes of this bench still running (there must be none)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"hetero_bench.{_WORKER}" in cmdline:
                found.append(f"process {proc.name}: {cmdline[:120]}")
    return found
