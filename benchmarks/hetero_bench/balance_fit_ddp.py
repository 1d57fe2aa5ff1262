"""``bench balance``'s bare-DDP loop: torch DDP, PowerSGD DDP, or the hetero runtime on torch DDP.

The same job as :mod:`.balance_fit_lightning` without a framework: what a user of plain PyTorch
writes (:class:`~hetero_strategy.runtime.HeteroRuntime` around their own loop), and cheap to start,
which decides whether a 4-rank run on 2 cores fits in minutes (``--framework ddp``).
"""

from __future__ import annotations

import argparse
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero_bench.balance_workload import (
    bench_model,
    hetero_options,
    powersgd_state,
    run_loop,
    runtime_record,
    test_accuracy,
    train_data,
)
from hetero_bench.compression_e2e import interface_tx_bytes
from hetero_strategy.workloads.step_clock import StepClock

__all__ = ["build", "fit"]


def fit(mode: str, args: argparse.Namespace, world: int, steps: int) -> dict:
    net, model, loader, loss_of, opt, clock, runtime = build(mode, args, world, steps)
    run_loop(model, loader, loss_of, steps, opt, clock, runtime)
    out = clock.record(mode) | runtime_record(runtime)
    if args.accuracy:
        out["accuracy"] = test_accuracy(net)
    return out


def build(mode: str, args: argparse.Namespace, world: int, steps: int) -> tuple[Any, ...]:
    """One mode's training, ready to step: (net, model, loader, loss of a batch, optimizer, clock,
    runtime or None)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(0)
    net = bench_model(args.model)
    data = train_data(args.batch, world, steps)
    clock = StepClock(counter=interface_tx_bytes if getattr(args, "count_bytes", False) else None)
    clock.attach(net)
    runtime = None
    if mode == "solo":
        model: nn.Module = net
        loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True)
    else:
        if not dist.is_initialized():  # one group for every mode of the launch (the worker destroys it)
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        # NOTE: PyTorch's powerSGD_hook chains collectives in future callbacks; with several buckets
        # on gloo ranks issue them in different orders and abort (hooks/baselines.py): one bucket
        model = DistributedDataParallel(net, **({"bucket_cap_mb": 1000} if mode == "ddp_powersgd" else {}))
        if mode in ("ddp", "ddp_powersgd"):
            sampler = DistributedSampler(data, shuffle=True, seed=0)
            loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
            if mode == "ddp_powersgd":
                model.register_comm_hook(powersgd_state(), powersgd.powerSGD_hook)
        else:
            runtime, loader = _hetero(mode, args, world, net, model, data, steps)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return net, model, loader, lambda b: nn.functional.cross_entropy(model(b[0]), b[1]), opt, clock, runtime


def _hetero(mode: str, args: argparse.Namespace, world: int, net: nn.Module, model: nn.Module, data: Any,
            steps: int) -> tuple[Any, Any]:
    from torch.utils.data import DataLoader

    from hetero_strategy.balance.probe import probe_step_cost
    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    config = HeteroConfig.from_flat(**hetero_options(mode, args, world))
    runtime = HeteroRuntime(config, int(os.environ["RANK"]), world)

    def measure(batches: list[tuple[Any, int]], exchange: Any) -> Any:
        # the probe times the bare module (not DDP, whose exchange it must not start)
        return probe_step_cost(net, lambda b: nn.functional.cross_entropy(net(b[0]), b[1]), batches,
                               config.balance.probe_steps, exchange=exchange)

    loader = runtime.train_loader(DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True), seed=0,
                                  measure=measure)
    runtime.register_hook(model, max_steps=steps)
    return runtime, loader
