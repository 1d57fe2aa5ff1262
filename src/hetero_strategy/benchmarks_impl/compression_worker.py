"""One rank of ``hetero-strategy bench compression`` (started by the emulator or by a local spawn).

Two jobs:

* ``steptime`` — ResNet-18 (torchvision, 11.7M parameters), 32x32 inputs, batch 32 per rank; one
  DDP model per method, warmed up, then timed steps *alternating* between methods (same link,
  same moment); reports per-step seconds and bytes sent by this rank.
* ``converge`` — an MLP on sklearn digits, every method x seed on the same ranks: test accuracy
  after a fixed step budget and the first evaluated step reaching the target accuracy.

Example (what the bench runs on each rank of a 2-rank emulated cluster)::

    python -m hetero_strategy.benchmarks_impl.compression_worker steptime --out /tmp/st.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_strategy.config import CompressionConfig
from hetero_strategy.hooks import CompressedState, PowerSGDBaselineState, powersgd_weighted_hook, topk_hook
from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

__all__ = ["METHODS", "main", "make_hook"]

METHODS = ("dense_fp32", "fp16", "powersgd", "topk", "tiered", "tiered_tuned")
# "tiered" is the DESIGN.md tier table as is; "tiered_tuned" shows its main knob: on eth1g exchange
# every step (not every 5) with base_density 0.1 (eth1g density 0.01 decaying to 0.001)
TUNED = {"base_density": 0.1, "overrides": {"eth1g": {"exchange_every": 1}}}


class _Counter(WeightedReduceState):
    """Byte counting for hooks that do not count (PyTorch's fp16 hook, the dense weighted hook)."""

    __slots__ = ["_acc", "last_bytes_sent"]

    def __init__(self) -> None:
        super().__init__(None)
        self._acc = self.last_bytes_sent = 0


def _count(state: _Counter, bucket, element_size: int) -> None:
    w = dist.get_world_size()
    state._acc += 2 * (w - 1) * bucket.buffer().numel() * element_size // w  # ring all-reduce
    if bucket.is_last():
        state.last_bytes_sent, state._acc = state._acc, 0


def _fp16_hook(state: _Counter, bucket):  # unannotated: postponed annotations in this file
    """PyTorch's own fp16_compress_hook, the baseline as users know it."""
    _count(state, bucket, 2)
    return default_hooks.fp16_compress_hook(None, bucket)


def _dense_hook(state: _Counter, bucket):
    _count(state, bucket, 4)
    return weighted_allreduce_hook(state, bucket)


def make_hook(method: str, steps: int, warmup: int, tiers: list[str] | None = None, base_density: float = 0.01,
              overrides: dict | None = None):
    """(state, hook, bucket_cap_mb) of a benchmark method."""
    if method == "dense_fp32":
        return _Counter(), _dense_hook, 25
    if method == "fp16":
        return _Counter(), _fp16_hook, 25
    if method == "powersgd":
        # NOTE: one bucket: upstream PowerSGD chains all-reduces in callbacks and aborts on gloo
        # with several buckets (collective order differs across ranks)
        return PowerSGDBaselineState(rank=4, start_iter=2), powersgd_weighted_hook, 1000
    if method == "topk":
        cfg = CompressionConfig(method="topk", base_density=0.01, density_schedule="constant",
                                dense_warmup_steps=warmup)
        return CompressedState(cfg, max_steps=steps), topk_hook, 25
    if method == "tiered_tuned":
        base_density, overrides = TUNED["base_density"], TUNED["overrides"]
    cfg = CompressionConfig(method="tiered", dense_warmup_steps=warmup, tiers=tiers, base_density=base_density,
                            min_density=min(0.001, base_density), tier_overrides=overrides)
    return CompressedState(cfg, max_steps=steps), topk_hook, 25


def _steptime(args: argparse.Namespace) -> dict:
    from torchvision.models import resnet18

    x = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(dist.get_rank()))
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(7))
    runs = {}
    for m in args.methods:
        torch.manual_seed(0)
        state, hook, cap = make_hook(m, steps=1000, warmup=1, base_density=args.base_density,
                                     overrides=args.tier_overrides)
        model = DDP(resnet18(num_classes=10), bucket_cap_mb=cap)
        model.register_comm_hook(state, hook)
        runs[m] = (model, state, torch.optim.SGD(model.parameters(), lr=0.01))

    def step(m: str) -> float:
        model, _, opt = runs[m]
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return time.perf_counter() - t0

    for m in args.methods:  # dense warm-up steps and DDP's bucket rebuild, not timed
        for _ in range(3 if m == "powersgd" else 2):
            step(m)
    out = {m: {"step_s": [], "bytes": [], "density": []} for m in args.methods}
    for _ in range(args.rounds):
        for m in args.methods:
            out[m]["step_s"].append(step(m))
            out[m]["bytes"].append(int(getattr(runs[m][1], "last_bytes_sent", 0)))
            out[m]["density"].append(float(getattr(runs[m][1], "density", 1.0)))
    out["_tier"] = getattr(runs.get("tiered", (None, None))[1], "tiers", None)
    return out


def _digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    return xtr, ytr, xte, yte


def _converge_one(method: str, seed: int, args: argparse.Namespace, data) -> dict:
    xtr, ytr, xte, yte = data
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    state, hook, cap = make_hook(method, steps=args.steps, warmup=args.warmup, tiers=[args.tier] * world,
                                 base_density=args.base_density, overrides=args.tier_overrides)
    model = DDP(net, bucket_cap_mb=cap)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    gen = torch.Generator().manual_seed(seed)
    per_rank, order, pos = 32, torch.randperm(len(xtr), generator=gen), 0
    curve, reached, dense_steps, dense_to_target = [], None, 0, None
    for step in range(1, args.steps + 1):
        if pos + per_rank * world > len(order):
            order, pos = torch.randperm(len(xtr), generator=gen), 0
        idx = order[pos + rank * per_rank: pos + (rank + 1) * per_rank]
        pos += per_rank * world
        opt.zero_grad()
        nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()
        dense_steps += _was_dense(method, state)
        if step % args.eval_every == 0:
            with torch.no_grad():
                acc = float((net(xte).argmax(1) == yte).float().mean())
            curve.append((step, acc))
            if reached is None and acc >= args.target:
                reached, dense_to_target = step, dense_steps
    return {"accuracy": curve[-1][1], "steps_to_target": reached, "dense_steps_to_target": dense_to_target,
            "curve": curve}


def _was_dense(method: str, state) -> bool:
    """Whether the step just taken sent dense fp32 gradients (warm-up, periodic sync), which cost
    a dense step on the slow link; the baselines' own steps are timed as they are."""
    if method == "powersgd":
        return state.powersgd.iter <= state.powersgd.start_powerSGD_iter  # iter counts after the hook
    if method in ("topk", "tiered", "tiered_tuned"):
        return all(mode in ("warmup", "dense") for mode in state.last_modes.values())
    return False


def _converge(args: argparse.Namespace) -> dict:
    data = _digits()
    return {m: [_converge_one(m, s, args, data) for s in range(args.seeds)] for m in args.methods}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="compression_worker")
    p.add_argument("job", choices=["steptime", "converge"])
    p.add_argument("--out", required=True, help="rank 0 writes its JSON here")
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--rounds", type=int, default=5, help="timed steps per method (alternating)")
    p.add_argument("--steps", type=int, default=300, help="convergence budget (steps)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--target", type=float, default=0.93)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=1, help="dense warm-up steps of topk/tiered (convergence)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--base-density", type=float, default=0.01, help="tiered policy's base density")
    p.add_argument("--tier-overrides", type=json.loads, default=None,
                   help='tiered policy overrides as JSON, e.g. {"eth1g": {"exchange_every": 1}}')
    p.add_argument("--tier", default="eth1g", help="tier the tiered policy uses in the convergence run")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    try:
        result = _steptime(args) if args.job == "steptime" else _converge(args)
        if dist.get_rank() == 0:
            with open(args.out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
