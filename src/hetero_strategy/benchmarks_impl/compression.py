"""``hetero-strategy bench compression``: dense fp32, fp16, PowerSGD, Top-K and tiered, in one run.

1. Step time and bytes per step: ResNet-18, batch 32 per rank, 2 ranks on the emulated cluster
   with 100 Mbit/s tbf links (namespaces; needs root), methods alternating step by step.
2. The same on an unthrottled link (loopback): what the tiered policy costs where it should not
   compress (it measures the link and picks its tier itself there).
3. Convergence on sklearn digits (MLP, 2 ranks, loopback, several seeds): test accuracy after a
   fixed budget and steps to the target accuracy; the tiered policy uses the tier the slow link
   gets (eth1g), so time-to-target = steps-to-target x slow-link step time, with the dense steps
   taken on the way (warm-up, periodic dense sync) charged at dense fp32's step time.

Writes JSON ``{"methods": {name: {step_time_s, bytes_per_step, accuracy, steps_to_target,
time_to_target_s, ...}}, ...}`` and a PNG chart beside it.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench compression --json benchmarks/results/compression.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hetero_strategy.cluster.tiers import parse_rate

__all__ = ["add_arguments", "run"]

_WORKER = [sys.executable, "-m", "hetero_strategy.benchmarks_impl.compression_worker"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="benchmarks/results/compression.json", help="where to write results")
    parser.add_argument("--link", default="100mbit", help="slow link rate for the step-time run")
    parser.add_argument("--rounds", type=int, default=10, help="timed steps per method (alternating)")
    parser.add_argument("--steps", type=int, default=300, help="convergence step budget")
    parser.add_argument("--seeds", type=int, default=3, help="convergence seeds")
    parser.add_argument("--target", type=float, default=0.93, help="digits test accuracy to reach")
    parser.add_argument("--lr", type=float, default=0.3, help="SGD learning rate of the convergence runs")
    parser.add_argument("--simulate-link", action="store_true",
                        help="no namespaces: slow-link step time = unthrottled compute + bytes / link rate "
                             "(labelled as computed in the JSON)")


def _local(args: list[str], timeout: float) -> None:
    """Two ranks on loopback (unshaped)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2",
                   LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        env.pop("HETERO_TIER", None)
        procs.append(subprocess.Popen([*_WORKER, *args], env=env))
    try:
        for p in procs:
            if p.wait(timeout=timeout) != 0:
                raise RuntimeError(f"bench worker failed with exit code {p.returncode}: {' '.join(args)}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _emulated(args: list[str], link: str, timeout: float) -> None:
    from hetero_strategy.emulate import EmulatedCluster

    with EmulatedCluster(compute=[1.0, 1.0], links=[link, link]) as cluster:
        result = cluster.run([*_WORKER, *args], timeout=timeout)
    if not result.ok:
        raise RuntimeError(f"emulated bench failed (rc {result.returncode}):\n" + "\n".join(result.outputs)[-3000:])


def _step_time(step: dict, fast: dict, m: str, link: str, computed: bool) -> float:
    if computed:  # compute measured unthrottled + the measured bytes over the link rate
        return statistics.mean(fast[m]["step_s"]) + statistics.mean(step[m]["bytes"]) * 8 / parse_rate(link)
    return statistics.mean(step[m]["step_s"])


def _summarise(step: dict, fast: dict, conv: dict, link: str, computed: bool) -> dict:
    """Per method; time-to-target charges the dense steps taken before the target (warm-up,
    periodic dense sync) at dense fp32's step time and the others at the method's own."""
    methods = {}
    dense_s = _step_time(step, fast, "dense_fp32", link, computed)
    for m, timing in step.items():
        if m.startswith("_"):
            continue
        step_s = _step_time(step, fast, m, link, computed)
        runs = conv[m]
        reached = [r["steps_to_target"] for r in runs if r["steps_to_target"] is not None]
        steps_to_target = statistics.mean(reached) if len(reached) == len(runs) else None
        times = [(r["dense_steps_to_target"] or 0) * dense_s + (r["steps_to_target"] - (r["dense_steps_to_target"] or 0))
                 * step_s for r in runs if r["steps_to_target"] is not None]
        methods[m] = {
            "step_time_s": step_s,
            "bytes_per_step": statistics.mean(timing["bytes"]),
            "density": statistics.mean(timing["density"]),
            "unthrottled_step_time_s": statistics.mean(fast[m]["step_s"]),
            "accuracy": statistics.mean(r["accuracy"] for r in runs),
            "accuracy_per_seed": [r["accuracy"] for r in runs],
            "steps_to_target": steps_to_target,
            "steps_to_target_per_seed": [r["steps_to_target"] for r in runs],
            "dense_steps_to_target_per_seed": [r["dense_steps_to_target"] for r in runs],
            "time_to_target_s": None if steps_to_target is None else statistics.mean(times),
        }
    return methods


def _ratios(methods: dict) -> dict:
    d, out = methods["dense_fp32"], {}
    if "topk" in methods:
        out["topk_speedup_vs_dense"] = d["step_time_s"] / methods["topk"]["step_time_s"]
        out["topk_speedup_vs_fp16"] = methods["fp16"]["step_time_s"] / methods["topk"]["step_time_s"]
    for name in ("tiered", "tiered_tuned"):
        t = methods.get(name, {})
        if t.get("time_to_target_s") is not None:
            for base in ("powersgd", "dense_fp32"):
                if methods[base]["time_to_target_s"]:
                    out[f"{name}_time_to_target_vs_{base}"] = t["time_to_target_s"] / methods[base]["time_to_target_s"]
        if t:
            out[f"{name}_accuracy_minus_dense_points"] = 100 * (t["accuracy"] - d["accuracy"])
            out[f"{name}_unthrottled_overhead"] = t["unthrottled_step_time_s"] / d["unthrottled_step_time_s"] - 1
    return out


def _chart(methods: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(methods)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("step_time_s", "step time on the slow link (s)"), ("bytes_per_step", "MB sent per rank per step"),
              ("time_to_target_s", "time to target accuracy (s)")]
    for ax, (key, title) in zip(axes, panels):
        vals = [(methods[n][key] or 0) / (1e6 if key == "bytes_per_step" else 1) for n in names]
        ax.bar(names, vals, color=["#777", "#999", "#c84", "#48c", "#2a6", "#6c6"][: len(names)])
        ax.set_title(title + " (log)", fontsize=10)
        ax.set_yscale("log")
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        slow, fast, conv = (os.path.join(tmp, f) for f in ("slow.json", "fast.json", "conv.json"))
        print("bench compression: unthrottled step time (loopback) ...", flush=True)
        _local(["steptime", "--out", fast, "--rounds", str(args.rounds)], timeout=900)
        if not args.simulate_link:
            print(f"bench compression: step time on {args.link} (emulated namespaces) ...", flush=True)
            _emulated(["steptime", "--out", slow, "--rounds", str(args.rounds)], args.link, timeout=900)
        print("bench compression: convergence on digits (loopback) ...", flush=True)
        _local(["converge", "--out", conv, "--steps", str(args.steps), "--seeds", str(args.seeds), "--warmup", "1",
                "--target", str(args.target), "--lr", str(args.lr), "--momentum", "0"], timeout=900)
        fast_r = json.loads(Path(fast).read_text())
        slow_r = fast_r if args.simulate_link else json.loads(Path(slow).read_text())
        conv_r = json.loads(Path(conv).read_text())
    methods = _summarise(slow_r, fast_r, conv_r, args.link, computed=args.simulate_link)
    result = {
        "methods": methods,
        "ratios": _ratios(methods),
        "setup": {
            "link": args.link,
            "slow_link_timing": "computed: unthrottled step + bytes/rate" if args.simulate_link
            else "measured on emulated tbf links (network namespaces)",
            "tier_on_slow_link": slow_r.get("_tier"), "tier_unthrottled": fast_r.get("_tier"),
            "steptime_model": "torchvision resnet18, 32x32, batch 32/rank, 2 ranks, 1 CPU thread each",
            "convergence": f"MLP 64-128-10 on sklearn digits, SGD lr {args.lr}, batch 32/rank, {args.steps} steps, "
                           f"{args.seeds} seeds, target {args.target}; tiered uses tier eth1g",
            "tiered_tuned": "tiered with base_density 0.1 and tier_overrides {eth1g: {exchange_every: 1}}",
            "rounds": args.rounds,
        },
    }
    out.write_text(json.dumps(result, indent=2))
    _chart(methods, out.with_suffix(".png"))
    _print(methods, result["ratios"])
    return 0


def _print(methods: dict, ratios: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bench compression")
    for col in ("method", "step s", "MB/step", "fast step s", "accuracy", "steps→target", "time→target s"):
        table.add_column(col)
    for m, v in methods.items():
        table.add_row(m, f"{v['step_time_s']:.3f}", f"{v['bytes_per_step'] / 1e6:.2f}",
                      f"{v['unthrottled_step_time_s']:.3f}", f"{v['accuracy']:.3f}", str(v["steps_to_target"]),
                      "-" if v["time_to_target_s"] is None else f"{v['time_to_target_s']:.1f}")
    console = Console()
    console.print(table)
    console.print({k: round(v, 3) for k, v in ratios.items()})
