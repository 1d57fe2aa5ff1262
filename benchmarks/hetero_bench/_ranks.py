"""Around a benchmark's ranks: the worker's side (one gloo group, rank 0 writes the JSON) and the
driver's (the worker's command line, launch the workers on the emulated cluster, collect every
rank's JSON)."""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["BENCHMARKS_DIR", "gloo_job", "run_job", "worker"]

BENCHMARKS_DIR = str(Path(__file__).resolve().parents[1])  # the checkout's benchmarks/, above this package


def worker(module: str) -> list[str]:
    """The command line that starts ``hetero_bench.<module>`` in a new interpreter.

    NOTE: this package is not installed, so its folder goes on this process's ``PYTHONPATH``,
    which every process it starts inherits: the emulator's ranks, ``accelerate launch``, torchrun.
    """
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if BENCHMARKS_DIR not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([BENCHMARKS_DIR, *paths])
    return [sys.executable, "-m", f"hetero_bench.{module}"]


def gloo_job(out: str, job: Callable[[], dict], timeout_s: float = 300) -> int:
    """Run ``job`` on this rank (one CPU thread, gloo from the torchrun environment); rank 0
    writes its result to ``out``; the group is destroyed whatever happens."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = job()
        if dist.get_rank() == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()
    return 0


def run_job(cluster: Any, cmd: list[str], modes: Sequence[str], out: Path, timeout: float, console: Any,
            name: str) -> dict[str, list[dict]]:
    """Run ``cmd`` on every rank of ``cluster``; ``<mode>_r<rank>.json`` under ``out`` per mode.

    A failed or timed-out launch raises RuntimeError with every rank's output tail.
    """
    out.mkdir(parents=True, exist_ok=True)
    res = cluster.run(cmd, timeout=timeout)
    if not res.ok:
        tail = "\n".join(f"--- rank {k} ---\n{o[-2500:]}" for k, o in enumerate(res.outputs))
        raise RuntimeError(f"{name} run failed (exit codes {res.returncodes}, timed out {res.timed_out}):\n{tail}")
    console.print(f"  {name}: {res.wall_s:.1f} s")
    return {m: [json.loads(Path(out, f"{m}_r{k}.json").read_text()) for k in range(len(res.returncodes))]
            for m in modes}
