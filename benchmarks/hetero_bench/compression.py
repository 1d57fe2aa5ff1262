"""``hetero-strategy bench compression``: dense fp32, fp16, PowerSGD, Top-K and tiered, in one run.

1. Step time and bytes per step: ResNet-18, batch 32 per rank, 2 ranks on the emulated cluster
   with 100 Mbit/s tbf links (namespaces; needs root), methods alternating step by step. Bytes
   are the hook's count and the rank's interface transmit counter (inside its namespace).
2. The same on an unthrottled link (loopback): what compression costs where it does not pay
   (``dense_fallback`` measures the link and the codec and sends densely there).
3. Time to accuracy, end to end, on the emulated link: a small CNN on sklearn digits trains with
   every method x seed in turn; the wall clock to the target held-out accuracy and the accuracy
   after the budget (:mod:`.compression_e2e`).

Writes JSON ``{"methods": {name: {step_time_s, unthrottled_step_time_s, accuracy,
time_to_target_s, ...}}, "ratios": {...}, "setup": {...}}`` and a PNG chart beside it. Times are
medians, with their spread (min, max) beside them.

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

from hetero_bench._ranks import worker
from hetero_strategy.cluster.tiers import parse_rate
from hetero_strategy.commands.flags import count, number, rate
from hetero_strategy.emulate.launch import die_with_parent

__all__ = ["add_arguments", "run"]

_WORKER = "compression_worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default="benchmarks/results/compression.json", help="where to write results")
    parser.add_argument("--link", type=rate, default="100mbit", help="slow link rate (step time and time to accuracy)")
    parser.add_argument("--rounds", type=count(1), default=10, help="timed steps per method (alternating)")
    parser.add_argument("--steps", type=count(1), default=200, help="time-to-accuracy step budget")
    parser.add_argument("--seeds", type=count(1), default=3, help="time-to-accuracy seeds")
    parser.add_argument("--target", type=number(0.0, 1.0, what="an accuracy"), default=0.95, help="digits held-out accuracy to reach")
    parser.add_argument("--lr", type=number(what="a learning rate"), default=0.05, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--methods", nargs="+", default=None, help="a subset of the methods (default: all)")
    parser.add_argument("--simulate-link", action="store_true",
                        help="no namespaces: slow-link time = unthrottled compute + the hook's bytes / link rate "
                             "(labelled as computed in the JSON; compression is then forced on)")


def _local(args: list[str], timeout: float, env: dict[str, str] | None = None,
           argv: list[str] | None = None) -> None:
    """Two ranks of the worker command ``argv`` (default: this bench's) on loopback (unshaped)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2",
                 LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        e.pop("HETERO_TIER", None)
        e.update(env or {})
        procs.append(subprocess.Popen([*(argv or worker(_WORKER)), *args], env=e, preexec_fn=die_with_parent))  # noqa: PLW1509
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
        result = cluster.run([*worker(_WORKER), *args], timeout=timeout)
    if not result.ok:
        raise RuntimeError(f"emulated bench failed (rc {result.returncode}):\n" + "\n".join(result.outputs)[-3000:])


def _spread(xs: list[float]) -> list[float]:
    return [min(xs), max(xs)]


def _summarise(slow: dict, fast: dict, conv: dict, link: str, computed: bool) -> dict:
    """Per method: step times (medians, spread), bytes, and the end-to-end convergence figures."""
    methods = {}
    for m, timing in slow.items():
        if m.startswith("_"):
            continue
        steps = timing["step_s"]
        if computed:  # unthrottled compute + the hook's bytes over the link rate, round by round
            steps = [t + b * 8 / parse_rate(link) for t, b in zip(fast[m]["step_s"], fast[m]["bytes"])]
        runs = conv[m]
        reached = [r["time_to_target_s"] for r in runs]
        methods[m] = {
            "step_time_s": statistics.median(steps),
            "step_time_spread_s": _spread(steps),
            "bytes_per_step": statistics.median(timing["bytes"]),
            "wire_bytes_per_step": None if computed else statistics.median(timing["wire_bytes"]),
            "density": statistics.mean(timing["density"]),
            "unthrottled_step_time_s": statistics.median(fast[m]["step_s"]),
            "unthrottled_step_time_spread_s": _spread(fast[m]["step_s"]),
            "accuracy": statistics.mean(r["accuracy"] for r in runs),
            "accuracy_per_seed": [r["accuracy"] for r in runs],
            "steps_to_target": None if None in reached else statistics.mean(r["steps_to_target"] for r in runs),
            "steps_to_target_per_seed": [r["steps_to_target"] for r in runs],
            "time_to_target_s": None if None in reached else statistics.median(reached),
            "time_to_target_per_seed_s": reached,
            "e2e_step_time_s": statistics.median(r["step_time_s"] for r in runs),
            "e2e_hook_bytes_per_step": statistics.median(r["hook_bytes_per_step"] for r in runs),
            "e2e_wire_bytes_per_step": None if computed else statistics.median(r["wire_bytes_per_step"] for r in runs),
            "e2e_dense_steps_per_seed": [r["dense_steps"] for r in runs],
            "dense_fallback": statistics.mean(timing.get("dense_fallback", [0.0])),
        }
    return methods


def _ratios(methods: dict, fast: dict) -> dict:
    d, out = methods["dense_fp32"], {}
    if "topk" in methods:
        out["topk_speedup_vs_dense"] = d["step_time_s"] / methods["topk"]["step_time_s"]
        out["topk_speedup_vs_fp16"] = methods["fp16"]["step_time_s"] / methods["topk"]["step_time_s"]
    for name in ("topk", "topk_allreduce", "tiered"):
        if name not in methods:
            continue
        # per round: the methods alternate step by step, so each round's ratio shares its moment
        per_round = [a / b - 1 for a, b in zip(fast[name]["step_s"], fast["dense_fp32"]["step_s"])]
        out[f"{name}_unthrottled_overhead"] = statistics.median(per_round)
        out[f"{name}_unthrottled_overhead_spread"] = _spread(per_round)
        t = methods[name]
        for base in ("powersgd", "dense_fp32", "fp16"):
            if t["time_to_target_s"] is not None and methods.get(base, {}).get("time_to_target_s"):
                out[f"{name}_time_to_target_vs_{base}"] = t["time_to_target_s"] / methods[base]["time_to_target_s"]
        out[f"{name}_accuracy_minus_dense_points"] = 100 * (t["accuracy"] - d["accuracy"])
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
        ax.bar(names, vals, color=["#777", "#999", "#c84", "#48c", "#a4c", "#2a6", "#6c6"][: len(names)])
        ax.set_title(title + " (log)", fontsize=10)
        ax.set_yscale("log")
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from hetero_bench.compression_worker import METHODS

    unknown = [m for m in args.methods or () if m not in METHODS]
    if unknown or (args.methods and "dense_fp32" not in args.methods):
        print(f"bench compression: --methods={' '.join(args.methods)!r} is invalid: "
              f"{f'{unknown[0]!r} is unknown; ' if unknown else ''}choose from {', '.join(METHODS)}, "
              "including dense_fp32 (every ratio is against it)", file=sys.stderr)
        return 2
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    picked = ["--methods", *(args.methods or METHODS)]
    conv_args = ["--steps", str(args.steps), "--seeds", str(args.seeds), "--target", str(args.target),
                 "--lr", str(args.lr), *picked]
    with tempfile.TemporaryDirectory() as tmp:
        slow, fast, conv = (os.path.join(tmp, f) for f in ("slow.json", "fast.json", "conv.json"))
        print("bench compression: unthrottled step time (loopback) ...", flush=True)
        _local(["steptime", "--out", fast, "--rounds", str(args.rounds), *picked], timeout=900)
        if args.simulate_link:
            print(f"bench compression: time to accuracy, {args.link} computed (loopback) ...", flush=True)
            _local(["converge", "--out", conv, *conv_args, "--no-fallback", "--charge-link",
                    str(parse_rate(args.link))], timeout=1800, env={"HETERO_TIER": "eth1g"})
        else:
            print(f"bench compression: step time on {args.link} (emulated namespaces) ...", flush=True)
            _emulated(["steptime", "--out", slow, "--rounds", str(args.rounds), *picked], args.link, timeout=900)
            print(f"bench compression: time to accuracy on {args.link} (emulated namespaces) ...", flush=True)
            _emulated(["converge", "--out", conv, *conv_args], args.link, timeout=1800)
        fast_r = json.loads(Path(fast).read_text())
        slow_r = fast_r if args.simulate_link else json.loads(Path(slow).read_text())
        conv_r = json.loads(Path(conv).read_text())
    methods = _summarise(slow_r, fast_r, conv_r, args.link, computed=args.simulate_link)
    result = {
        "methods": methods,
        "ratios": _ratios(methods, fast_r),
        "setup": {
            "link": args.link,
            "slow_link_timing": "computed: unthrottled step + bytes/rate" if args.simulate_link
            else "measured on emulated tbf links (network namespaces)",
            "tier_on_slow_link": slow_r.get("_tier"), "tier_unthrottled": fast_r.get("_tier"),
            "steptime_model": "torchvision resnet18, 32x32, batch 32/rank, 2 ranks, 1 CPU thread each; "
                              "topk: base_density 0.01 constant, 1 dense warm-up step",
            "convergence": f"CNN 283k parameters on sklearn digits, SGD lr {args.lr} momentum 0.9, batch 32/rank, "
                           f"{args.steps} steps, {args.seeds} seeds, target {args.target}, measured end to end on "
                           f"the {'computed' if args.simulate_link else 'emulated'} {args.link} link; topk and tiered "
                           "with the config defaults (topk: base_density 0.01 constant)",
            "rounds": args.rounds,
            "statistics": "times are medians; *_spread are [min, max]; overheads are per-round ratios",
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
    for col in ("method", "step s", "MB/step (hook)", "MB/step (wire)", "fast step s", "accuracy",
                "steps→target", "time→target s"):
        table.add_column(col)
    for m, v in methods.items():
        wire = "-" if v["wire_bytes_per_step"] is None else f"{v['wire_bytes_per_step'] / 1e6:.2f}"
        table.add_row(m, f"{v['step_time_s']:.3f}", f"{v['bytes_per_step'] / 1e6:.2f}", wire,
                      f"{v['unthrottled_step_time_s']:.3f}", f"{v['accuracy']:.3f}", str(v["steps_to_target"]),
                      "-" if v["time_to_target_s"] is None else f"{v['time_to_target_s']:.1f}")
    console = Console()
    console.print(table)
    console.print({k: [round(x, 3) for x in v] if isinstance(v, list) else round(v, 3) for k, v in ratios.items()})
