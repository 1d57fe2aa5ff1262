"""One rank of ``hetero-strategy bench lengths`` (started by the emulator, torchrun-style env).

Modes, on the length-skewed text task (:mod:`hetero_strategy.workloads.skewed_text`), bare DDP:

* ``solo`` — this rank alone (no process group): its tokens per second.
* ``ddp`` — torch DDP, equal sample counts (``DistributedSampler``).
* ``count`` — the hetero runtime with ``batch_sizes=--sizes``: each rank takes its share of every
  global batch by count.
* ``cost`` — the same shares with ``sample_cost="lengths"``: each global batch dealt out by tokens.

Every rank records per step its start time, its token count and its compute time.

Example::

    PYTHONPATH=benchmarks python -m hetero_bench.lengths_worker --mode cost --sizes 40,24 --out /tmp/l
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hetero_bench.balance_workload import run_loop, runtime_record
from hetero_strategy.workloads.step_clock import StepClock

__all__ = ["MODES", "main"]

MODES = ("solo", "ddp", "count", "cost")


def _fit(args: argparse.Namespace) -> dict:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime
    from hetero_strategy.workloads.skewed_text import PackedTokenMLP, SkewedTexts, pack

    world = 1 if args.mode == "solo" else int(os.environ["WORLD_SIZE"])
    data = SkewedTexts((args.steps + 2) * args.batch * world, seed=1)
    net = PackedTokenMLP(vocab=data.vocab)
    clock = StepClock()
    clock.attach(net)
    runtime, model = None, net
    if args.mode == "solo":
        loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True, collate_fn=pack)
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        model = DistributedDataParallel(net)
        if args.mode == "ddp":
            loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data, seed=0),
                                drop_last=True, collate_fn=pack)
        else:
            sizes = [int(b) for b in args.sizes.split(",")]
            cost = {"sample_cost": "lengths"} if args.mode == "cost" else {}
            runtime = HeteroRuntime(HeteroConfig.from_flat(batch_sizes=sizes, **cost), dist.get_rank(), world)
            loader = runtime.train_loader(DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                                     collate_fn=pack), seed=0)
            runtime.register_hook(model, max_steps=args.steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def loss_of(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, segments, labels = batch
        return nn.functional.cross_entropy(model(tokens, segments, len(labels)), labels)

    run_loop(model, loader, loss_of, args.steps, opt, clock, runtime, count_of=lambda b: len(b[0]))
    out = clock.record(args.mode) | runtime_record(runtime)  # "batches" hold tokens per step here
    if args.mode != "solo":
        dist.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", required=True, help="directory; this rank writes <mode>_r<RANK>.json there")
    p.add_argument("--batch", type=int, default=32, help="mean samples per rank per step")
    p.add_argument("--sizes", default=None, help="count / cost: the per-rank batch sizes, e.g. 40,24")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    if args.mode in ("count", "cost") and not args.sizes:
        p.error(f"--mode {args.mode} needs --sizes (the per-rank batch sizes, e.g. 40,24)")
    torch.set_num_threads(1)
    result = _fit(args)
    result["rank"] = int(os.environ.get("RANK", "0"))
    Path(args.out, f"{args.mode}_r{result['rank']}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
