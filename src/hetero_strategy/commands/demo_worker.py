"""One rank of ``hetero-strategy demo``: plain DDP and hetero trained side by side, in alternating rounds.

Started by the demo on every rank of the emulated cluster (torchrun-style environment). Two copies
of one ResNet-18 (same initial weights) learn the digits in one job: a plain
``DistributedDataParallel`` with equal batches, and the same model under
:class:`~hetero_strategy.runtime.HeteroRuntime` (a probe of the real model splits the batch, online
calibration refines it: the core every adapter drives). Each round runs ``--block`` steps of one,
then of the other, the order swapping every round, so both see the same machine; run one after
the other, a neighbour's load or a clock change landed on one run only and moved the ratio by
tens of per cent. Both follow the same cosine learning-rate decay to zero, so the final weights,
and the test accuracy, settle instead of landing wherever the last steps threw them.

Each rank writes ``r<RANK>.json``: per mode and step its round, batch size, wall and compute time;
the hetero split after the probe and after each calibration; rank 0 adds each mode's test accuracy.

Example::

    hetero-strategy emulate --compute 1.0,0.57 -- \\
        python -m hetero_strategy.commands.demo_worker --out /tmp/demo --rounds 12 --block 6
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero_strategy.workloads.step_clock import StepClock

__all__ = ["MODES", "main"]

MODES = ("ddp", "hetero_auto")


class _Run:
    """One mode's model, loader, optimizer, clock and record; ``step()`` runs one training step."""

    def __init__(self, mode: str, model: nn.Module, net: nn.Module, loader: Any, args: argparse.Namespace,
                 runtime: Any = None) -> None:
        self.mode, self.model, self.net, self.runtime = mode, model, net, runtime
        self.batches = iter(loader)
        self.opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        total = args.rounds * args.block
        # cosine decay to 0 over the run: the last steps move the weights little, so the accuracy does
        # not depend on where the final few noisy steps land
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda t: 0.5 * (1 + math.cos(math.pi * t / total)))
        self.clock = StepClock()
        self.clock.attach(net)
        self.record: dict[str, list] = {"round": [], "step_s": []}
        self.steps = 0

    def step(self, round_: int) -> None:
        t0 = time.perf_counter()  # start to start, as runtime/metrics.py defines a step (the fetch included)
        x, y = next(self.batches)
        if self.runtime is not None:
            self.runtime.batch_start()
        self.clock.batch_start(len(y))
        nn.functional.cross_entropy(self.model(x), y).backward()
        if self.runtime is not None:
            self.runtime.backward_end()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        self.clock.batch_end()
        if self.runtime is not None:
            self.runtime.step_end(self.steps)
        self.record["step_s"].append(time.perf_counter() - t0)
        self.record["round"].append(round_)
        self.steps += 1

    def result(self) -> dict[str, Any]:
        return self.record | {"batches": self.clock.batches, "compute_s": self.clock.compute_s}


def _runs(args: argparse.Namespace, rank: int, world: int) -> dict[str, _Run]:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime
    from hetero_strategy.runtime.model_probe import module_measure
    from hetero_strategy.workloads.digits import covering, digits_datasets
    from hetero_strategy.workloads.resnets import resnet18_imagenet_stem

    train, _ = digits_datasets(size=32)
    data = covering(train, (args.rounds * args.block + 2) * args.batch * world)
    torch.manual_seed(0)
    base = resnet18_imagenet_stem()
    net = copy.deepcopy(base)  # the same initial weights for both modes
    config = HeteroConfig.from_flat(overlap_comm=True, calibrate=True, cold_start_steps=args.cold_start,
                                    recalibrate_every=args.recalibrate_every, window=args.window)
    runtime = HeteroRuntime(config, rank, world, info=lambda m: print(m, flush=True))  # the probe's decision
    measure = module_measure(runtime, net, to_device=lambda b: b,
                             loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]))
    loader = runtime.train_loader(DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True), seed=0,
                                  measure=measure)
    hetero = DistributedDataParallel(net)
    runtime.register_hook(hetero, max_steps=args.rounds * args.block)
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    plain = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    return {"ddp": _Run("ddp", DistributedDataParallel(base), base, plain, args),
            "hetero_auto": _Run("hetero_auto", hetero, net, loader, args, runtime)}


def _train(args: argparse.Namespace, rank: int, world: int) -> dict[str, Any]:
    from hetero_strategy.workloads.digits import accuracy, digits_datasets

    runs = _runs(args, rank, world)
    probed = list(runs["hetero_auto"].runtime.sampler.batch_sizes)
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]  # ABBA: neither mode always follows the other
        for mode in order:
            for _ in range(args.block):
                runs[mode].step(r)
        if args.progress and rank == 0:
            global_batch = args.batch * world
            speed = ", ".join(f"{m} {global_batch / statistics.median(runs[m].record['step_s'][-args.block:]):.0f}"
                              for m in MODES)
            print(f"round {r + 1}/{args.rounds}: samples/s {speed}; hetero split "
                  f"{runs['hetero_auto'].runtime.sampler.batch_sizes}", flush=True)
    out: dict[str, Any] = {"rank": rank, "probe_split": probed, "modes": {m: run.result() for m, run in runs.items()}}
    balancer = runs["hetero_auto"].runtime.balancer
    out["decisions"] = balancer.calibrator.decisions if balancer is not None else []
    if rank == 0:
        _, test = digits_datasets(size=32)
        out["accuracy"] = {m: accuracy(run.net, test) for m, run in runs.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo_worker", description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", required=True, help="directory; this rank writes r<RANK>.json there")
    p.add_argument("--batch", type=int, default=128, help="mean per-rank batch B")
    p.add_argument("--rounds", type=int, default=12, help="rounds of --block steps of each mode")
    p.add_argument("--block", type=int, default=6, help="steps of one mode before the other's")
    p.add_argument("--cold-start", type=int, default=3, help="hetero: static steps before calibrating")
    p.add_argument("--recalibrate-every", type=int, default=8)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--progress", action="store_true", help="print a line per round (rank 0)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result = _train(args, rank, world)
    finally:
        dist.destroy_process_group()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"r{rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
