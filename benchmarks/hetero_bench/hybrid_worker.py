"""One rank of ``bench hybrid``: time to accuracy of synchronous and hybrid training, in turn.

A small CNN (:func:`~.compression_e2e.make_cnn`) learns sklearn's digits on bare DDP +
HeteroRuntime, every mode x seed in turn (so slow drifts of the machine hit every mode alike),
for the same number of epochs: every mode sees the same samples. The clock runs over training
only; held-out evaluations are not timed. They happen where every rank holds the same model:
every ``--eval-every`` steps of synchronous training, and at every sync of a local phase. At
each epoch end (after ``join``, in hybrid mode) the held-out loss also goes to the phase
schedule (``runtime.evaluated``), the same on every rank, so a phase changes at an epoch
boundary, where every rank stands at the same batch of the epoch.

argv: out_dir --modes ... --seeds N --epochs E --batch B --capacities a,b. Rank r writes
``hybrid_r<r>.json``: {mode: [per-seed {curve: [(leader steps, accuracy, seconds)], accuracy,
train_s, phases, syncs, ...}]}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from hetero_bench._ranks import gloo_job
from hetero_bench.compression_e2e import make_cnn
from hetero_strategy.config import HeteroConfig
from hetero_strategy.runtime import HeteroRuntime
from hetero_strategy.workloads.digits import digits_datasets

__all__ = ["MODES", "main"]

# mode -> HeteroConfig fields on top of the shared ones (the split comes from --capacities)
MODES: dict[str, dict] = {
    "sync": {},
    "sync_topk": {"compression": "topk"},
    "hybrid": {"mode": "hybrid"},
    "hybrid_equal": {"mode": "hybrid", "equal": True},  # equal batches: unequal step counts
}


def _evaluate(net: nn.Module, test) -> tuple[float, float]:
    with torch.no_grad():
        x, y = test.tensors
        logits = net(x)
        return float((logits.argmax(1) == y).float().mean()), float(nn.functional.cross_entropy(logits, y))


def _run(mode: str, seed: int, args: argparse.Namespace, train, test) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    fields = dict(MODES[mode])
    equal = fields.pop("equal", False)
    capacities = [1.0] * world if equal else args.capacities
    config = HeteroConfig.from_flat(capacities=capacities, stall_timeout_s=300, **fields)
    torch.manual_seed(seed)
    net = make_cnn()
    dist.barrier()
    clock = time.perf_counter()
    runtime = HeteroRuntime(config, rank, world)
    loader = runtime.train_loader(DataLoader(train, batch_size=args.batch, shuffle=True), seed=seed)
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp, max_steps=args.epochs * len(loader))
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    trained, curve, phases, period_steps = 0.0, [], [], []
    hybrid = runtime.hybrid

    def record(schedule: bool) -> None:
        nonlocal trained, clock
        trained += time.perf_counter() - clock
        acc, loss = _evaluate(net, test)
        steps = torch.tensor([float(runtime.steps)])
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # the leader's step count (untimed)
        curve.append((int(steps), acc, trained))
        if schedule and runtime.evaluated(loss):
            phases.append((int(steps), trained))
        clock = time.perf_counter()

    synced_steps = 0  # steps after which every rank holds the same model: counted alike everywhere
    for epoch in range(args.epochs):
        loader.batch_sampler.set_epoch(epoch)
        for x, y in loader:
            runtime.batch_start()
            with runtime.local_step(ddp), runtime.phase("exchange"):
                nn.functional.cross_entropy(ddp(x), y).backward()
            runtime.before_optimizer_step(opt)
            opt.step()
            opt.zero_grad(set_to_none=True)
            runtime.step_end(samples=len(x))
            if runtime.synced:  # every step when synchronous; a period's last step in a local phase
                synced_steps += 1
                if hybrid is not None and hybrid.local:
                    period_steps.append(hybrid.controller.last["steps"])
                    record(schedule=False)
                elif synced_steps % args.eval_every == 0:
                    record(schedule=False)
        if hybrid is not None:
            hybrid.join()  # this rank's epoch is over: it waits in the syncs until every rank's is
        record(schedule=True)
    runtime.close()
    out = {"accuracy": curve[-1][1], "train_s": trained, "curve": curve, "phases": phases,
           "steps": runtime.steps, "batch_sizes": runtime.sampler.batch_sizes}
    if hybrid is not None:
        out["hybrid"] = hybrid.metrics()
        out["period_steps"] = period_steps  # each local period's steps per rank (from its sync)
    return out


def _job(args: argparse.Namespace) -> dict:
    train, test = digits_datasets()
    warm = argparse.Namespace(**{**vars(args), "epochs": 1})
    _run(args.modes[0], 0, warm, train, test)  # one-time costs (allocator, gloo) land on nobody
    out: dict[str, list] = {m: [] for m in args.modes}
    for seed in range(args.seeds):
        k = seed % len(args.modes)
        for m in args.modes[k:] + args.modes[:k]:  # rotated per seed: no mode always runs first
            r = _run(m, seed, args, train, test)
            out[m].append(r)
            if dist.get_rank() == 0:
                print(f"hybrid bench {m} seed {seed}: acc {r['accuracy']:.3f} after {r['train_s']:.1f} s "
                      f"({r['steps']} steps on rank 0, phase switches at {r['phases']})", flush=True)
    (args.out / f"hybrid_r{dist.get_rank()}.json").write_text(json.dumps(out))  # every rank: the driver reads all
    return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hybrid_worker")
    p.add_argument("out", type=Path)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--capacities", type=lambda s: [float(v) for v in s.split(",")], required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    return gloo_job(str(args.out / "unused.json"), lambda: _job(args), timeout_s=600)


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
