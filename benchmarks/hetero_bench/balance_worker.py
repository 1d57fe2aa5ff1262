"""One rank of ``hetero-strategy bench balance`` (started by the emulator, torchrun-style env).

Modes (each starts from a fresh model, loader and optimizer; Lightning runs one per launch, the
bare-DDP loop several in turn in one launch, sharing its process group):

* ``solo`` — this rank's speed in the same training loop run as a single process (no
  communication; all ranks run at once, each on its own quota, as in training), then the bare
  all-reduce of a tensor the size of the model's gradient over gloo (t_ar).
* ``ddp`` / ``hetero`` / ``hetero_cal`` / ``hetero_auto`` — ``strategy="ddp"``, the static probe,
  calibration from equal shares, or the probe then calibration (as ``make demo`` does).
* ``split`` — ``batch_sizes=--sizes``: one fixed split.
* ``cycle`` — ``--framework ddp`` only: the ``--arms`` (plain DDP, fixed splits) in one launch,
  taking turns in blocks of steps (:mod:`.balance_cycle`; the benchmark's sweep).
* ``ddp_powersgd`` — DDP with PyTorch's own ``powerSGD_hook`` (equal batches).
* ``hetero_tiered`` — hetero with ``compression="tiered"`` and the static probe.
* ``hetero_codec`` — hetero with ``compression="auto"`` and the static probe (``bench plan``'s
  ``hetero_auto``).

``--framework lightning`` (default) trains with ``L.Trainer`` and ``HeteroStrategy``;
``--framework ddp`` with torch DDP and :class:`~hetero_strategy.runtime.HeteroRuntime`, no
framework. Every rank records the start time of each step, its batch size and its compute time.

Example::

    PYTHONPATH=benchmarks python -m hetero_bench.balance_worker --mode ddp --steps 30 --out /tmp/ddp
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from hetero_bench.balance_summary import FRAMEWORKS, MODELS, TRAININGS
from hetero_bench.balance_workload import bench_model

__all__ = ["MODES", "main"]

MODES = ("solo", "split", "cycle", *TRAININGS)
_LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def _fit(mode: str, args: argparse.Namespace, world: int) -> dict:
    loop = importlib.import_module(f"hetero_bench.balance_fit_{args.framework}")
    steps = {"solo": args.solo_steps, "hetero_cal": args.cal_steps, "hetero_auto": args.cal_steps}
    return loop.fit(mode, args, world, steps.get(mode, args.steps))


def _solo(args: argparse.Namespace) -> dict:
    """This rank's solo training speed (the same loop, one process), then t_ar."""
    import torch.distributed as dist

    # The loop must see a single-process run: hide the launcher's variables for the solo fit.
    saved = {k: os.environ.pop(k) for k in _LAUNCHER_ENV if k in os.environ}
    try:
        solo = _fit("solo", args, world=1)
    finally:
        os.environ.update(saved)
    # solo runs first: its group is then kept for the launch's next modes (main() destroys it)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    grad = torch.zeros(sum(p.numel() for p in bench_model(args.model).parameters()))  # (P,) the whole gradient
    ar = []
    for i in range(args.ar_reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(grad)
        if i >= 1:  # the first call sets up gloo's buffers
            ar.append(time.perf_counter() - t0)
    solo.update(t_ar_s=statistics.median(ar), ar_times=ar, grad_bytes=grad.numel() * 4)
    return solo


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", required=True,
                   help=f"one of {', '.join(MODES)}; with --framework ddp, several in turn (comma-separated)")
    p.add_argument("--out", required=True, help="directory; this rank writes <mode>_r<RANK>.json there")
    p.add_argument("--framework", choices=FRAMEWORKS, default="lightning")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--sizes", default=None, help="split mode: the per-rank batch sizes, e.g. 180,76")
    p.add_argument("--arms", default=None, help="cycle mode: 'ddp' or per-rank sizes, ';'-separated, e.g. ddp;91,37")
    p.add_argument("--blocks", type=int, default=4, help="cycle mode: blocks per arm")
    p.add_argument("--block-steps", type=int, default=3, help="cycle mode: steps per block (the first is not timed)")
    p.add_argument("--plan-sizes", action="append", default=None, metavar="MODE=SIZES",
                   help="run MODE (hetero, hetero_codec, ...) at these per-rank batch sizes instead of its "
                        "probe's, e.g. hetero=52,12 (bench plan: the planner's split); repeatable")
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--cal-steps", type=int, default=60, help="steps of hetero_cal / hetero_auto")
    p.add_argument("--measure", type=int, default=10, help="the driver's measured window (hetero_tiered's warm-up)")
    p.add_argument("--solo-steps", type=int, default=12)
    p.add_argument("--ar-reps", type=int, default=5)
    p.add_argument("--cold-start", type=int, default=5)
    p.add_argument("--recalibrate-every", type=int, default=10)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--progress", action="store_true", help="lightning: show the progress bar")
    p.add_argument("--overlap-comm", choices=("on", "off"), default="on", help="hetero: overlap_comm")
    p.add_argument("--accuracy", action="store_true", help="report test accuracy after training")
    p.add_argument("--count-bytes", action="store_true",
                   help="--framework ddp: record this rank's interface transmit counter at each step (\"sent\")")
    args = p.parse_args(argv)
    modes = args.mode.split(",")
    if any(m not in MODES for m in modes) or (len(modes) > 1 and ("solo" in modes[1:] or args.framework != "ddp")):
        p.error(f"--mode={args.mode!r} is invalid: give one of {', '.join(MODES)}, or with --framework ddp several "
                "(solo first, if at all)")
    if "split" in modes and not args.sizes:
        p.error("--mode split needs --sizes (the per-rank batch sizes, e.g. 180,76)")
    if "cycle" in modes and (not args.arms or args.framework != "ddp" or args.blocks < 1 or args.block_steps < 2):
        p.error("--mode cycle needs --framework ddp, --arms (e.g. 'ddp;91,37;100,28'), --blocks >= 1 and "
                "--block-steps >= 2 (the first step of a block is not timed)")
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    try:
        for mode in modes:
            if mode == "cycle":
                from hetero_bench.balance_cycle import cycle

                result = cycle(args, world)
            else:
                result = _solo(args) if mode == "solo" else _fit(mode, args, world)
            result["rank"] = rank
            Path(args.out, f"{mode}_r{rank}.json").write_text(json.dumps(result))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():  # the bare-DDP loop keeps one process group for all its modes
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
