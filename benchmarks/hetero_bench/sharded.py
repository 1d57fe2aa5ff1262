"""``hetero-strategy bench balance --sharded``: FSDP2 with even batches against ``hetero_fsdp`` on the
emulated 2-rank cluster, then the same with a memory limit on the slow rank.

Every round runs, in alternating order, plain FSDP2 (Lightning's ``ModelParallelStrategy``, even
batches), ``hetero_fsdp`` (shares and memory caps from the probe) and ``hetero_fsdp`` with the
slow rank's cgroup limited (``limited``). The limit comes from round 0's own probe of the slow
rank, in the kernel's accounting: its fixed memory plus room for a little over half of its share,
so ``hetero_fsdp`` must split that share into passes, while the even split needs more than the
limit. One more launch
runs plain FSDP2 under the limit and records whether the kernel killed it. Peaks are each rank's
working set (its memory cgroup's usage less inactive file cache, sampled: emulate/memwatch.py),
beside the kernel's charge, which counts page cache that grows to the limit. Samples/s are medians over the rounds, with [min, max].
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hetero_bench._ranks import worker

__all__ = ["run"]

_WORKER = "sharded_worker"
COMPUTE = [1.0, 0.57]
_ACCOUNTING_LIMIT = 16 << 30


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.emulate import EmulatedCluster, EmulatorError

    console = Console()
    started = time.perf_counter()
    try:
        with EmulatedCluster(COMPUTE, None, memory=["none", "none"]) as cluster, \
                tempfile.TemporaryDirectory(prefix="bench_sharded_") as tmp:
            result = _rounds(cluster, args, Path(tmp), console)
            result["cluster"] = cluster.describe()
    except (EmulatorError, RuntimeError) as e:
        console.print(f"bench balance --sharded: {e}", style="red", markup=False, highlight=False)
        return 1
    result["wall_s"] = time.perf_counter() - started
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    console.print(f"bench balance --sharded: {json.dumps(result['summary'])}\nwritten to {args.json}")
    return 0


def _rounds(cluster: Any, args: argparse.Namespace, tmp: Path, console: Any) -> dict:
    slow = cluster.memory_cgroups[1]
    # NOTE: a limit far above the need, so the slow rank's probe reads the kernel's charge of its
    # cgroup (balance/memory.py), the accounting the limit below is set in and the kernel kills by
    slow.set_limit(_ACCOUNTING_LIMIT)
    calibration = _launch(cluster, "hetero_fsdp", args, tmp / "calibrate", console)
    slow.set_limit(None)
    fixed, per_sample, _ = calibration[1]["memory_probe"][1]
    share = calibration[1]["batch_sizes"][1]
    room = math.ceil(0.55 * share)  # a little over half the slow rank's share: two passes
    limit = int((fixed + per_sample * room) / (1 - args.memory_margin))
    even_need = fixed + per_sample * args.batch
    console.print(f"slow rank: fixed {fixed / 2**20:.0f} MB, {per_sample / 2**20:.2f} MB per sample, share {share}; "
                  f"limit {limit / 2**20:.0f} MB (the even split needs {even_need / 2**20:.0f} MB)")
    runs: dict[str, list[dict]] = {"fsdp": [], "hetero_fsdp": [], "limited": []}
    peaks: list[list[int]] = []  # sampled working sets (emulate/memwatch.py)
    kernel_peaks: list[list[int]] = []  # the kernel's charge, page cache included
    for i in range(args.rounds):
        order = ["fsdp", "hetero_fsdp", "limited"]
        for name in order if i % 2 == 0 else order[::-1]:
            slow.set_limit(limit if name == "limited" else None)
            for cg in cluster.memory_cgroups:
                cg.reset_peak()
            with contextlib.ExitStack() as stack:
                watches = [stack.enter_context(cg.watch_working_set()) for cg in cluster.memory_cgroups]
                got = _launch(cluster, "fsdp" if name == "fsdp" else "hetero_fsdp", args, tmp / f"r{i}{name}",
                              console)
            runs[name].append({**got[0], "passes_per_step": [g["passes_per_step"] for g in got]})
            if name == "limited":
                peaks.append([w.peak for w in watches])
                kernel_peaks.append([cg.peak_bytes() for cg in cluster.memory_cgroups])
        console.print(f"round {i + 1}/{args.rounds}: " + ", ".join(
            f"{k} {v[-1]['samples_per_s']:.1f}/s" for k, v in runs.items()))
    slow.set_limit(limit)
    kills = slow.oom_kills()
    oom = _launch(cluster, "fsdp", args, tmp / "fsdp_limited", console, may_fail=True)
    killed = slow.oom_kills() > kills
    slow.set_limit(None)
    return _summary(runs, {"peak": peaks, "kernel": kernel_peaks}, limit, args, oom is None and killed,
                    calibration, even_need)


def _launch(cluster: Any, mode: str, args: argparse.Namespace, out: Path, console: Any,
            may_fail: bool = False) -> list[dict] | None:
    cmd = [*worker(_WORKER), "--mode", mode, "--out", str(out), "--batch", str(args.batch), "--steps",
           str(args.steps), "--measure", str(args.measure), "--memory-margin", str(args.memory_margin),
           "--size", str(args.size)]
    res = cluster.run(cmd, timeout=args.timeout)
    if not res.ok:
        if may_fail:
            console.print(f"  {mode}: failed as expected (exit codes {res.returncodes})")
            return None
        tail = "\n".join(f"--- rank {k} ---\n{o[-2500:]}" for k, o in enumerate(res.outputs))
        raise RuntimeError(f"{mode} run failed (exit codes {res.returncodes}):\n{tail}")
    return [json.loads((out / f"{mode}_r{k}.json").read_text()) for k in range(len(res.returncodes))]


def _median(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "spread": [min(values), max(values)], "values": values}


def _summary(runs: dict[str, list[dict]], peaks: dict[str, list[list[int]]], limit: int, args: argparse.Namespace,
             fsdp_oom: bool, calibration: list[dict], even_need: float) -> dict:
    rate = {k: _median([r["samples_per_s"] for r in v]) for k, v in runs.items()}
    limited = runs["limited"][-1]
    caps = limited.get("memory_caps") or [None, None]
    probe = limited.get("memory_probe") or [None, None]
    cap_bytes = [None if c is None or p is None else p[0] + p[1] * c for c, p in zip(caps, probe)]
    peak, kernel_peak = ([max(p[k] for p in rows) for k in range(len(rows[0]))]
                         for rows in (peaks["peak"], peaks["kernel"]))
    summary = {
        "hetero_fsdp_vs_fsdp": rate["hetero_fsdp"]["median"] / rate["fsdp"]["median"],
        "limited_vs_unlimited": rate["limited"]["median"] / rate["hetero_fsdp"]["median"],
        "fsdp_out_of_memory_under_the_limit": fsdp_oom,
        "peak_under_cap": all(c is None or p <= c for p, c in zip(peak, cap_bytes)),
    }
    return {
        "fsdp_samples_per_s": rate["fsdp"]["median"], "hetero_fsdp_samples_per_s": rate["hetero_fsdp"]["median"],
        "fsdp_samples_per_s_spread": rate["fsdp"]["spread"],
        "hetero_fsdp_samples_per_s_spread": rate["hetero_fsdp"]["spread"],
        "limited": {"fsdp_out_of_memory": fsdp_oom, "hetero_fsdp_samples_per_s": rate["limited"]["median"],
                    "hetero_fsdp_samples_per_s_spread": rate["limited"]["spread"],
                    "peak_bytes": peak, "kernel_peak_bytes": kernel_peak, "cap_bytes": cap_bytes, "limit_bytes": [None, limit],
                    "memory_caps": caps, "batch_sizes": limited["batch_sizes"],
                    "passes_per_step": limited["passes_per_step"],
                    "even_split_needs_bytes": even_need},
        "rounds": {k: v for k, v in runs.items()}, "calibration": calibration, "summary": summary,
        "goals": {"hetero_fsdp_vs_fsdp_at_least_1.3": summary["hetero_fsdp_vs_fsdp"] >= 1.3,
                  "limited_at_least_0.9_of_unlimited": summary["limited_vs_unlimited"] >= 0.9,
                  "fsdp_out_of_memory": fsdp_oom, "peak_under_cap": summary["peak_under_cap"]},
        "setup": {"compute": COMPUTE, "batch_per_rank": args.batch, "steps": args.steps, "measure_last": args.measure,
                  "rounds": args.rounds, "image_size": args.size, "memory_margin": args.memory_margin,
                  "workload": "3 conv 3x3 layers of 32 channels + linear, random images, SGD",
                  "statistics": "samples/s: medians over rounds, spread [min, max]; peak_bytes: each rank's "
                                "working set (usage less inactive file cache, sampled every 10 ms), the max "
                                "over rounds; kernel_peak_bytes: the kernel's charge, page cache included"},
    }
