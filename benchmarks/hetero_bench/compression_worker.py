"""One rank of ``hetero-strategy bench compression`` (started by the emulator or by a local spawn).

Two jobs:

* ``steptime`` — ResNet-18 (torchvision, 11.7M parameters), 32x32 inputs, batch 32 per rank; one
  DDP model per method, warmed up, then timed steps *alternating* between methods (same link,
  same moment); reports per-step seconds, the bytes the hook counted and the bytes this rank's
  interface sent (its transmit counter read around every step).
* ``converge`` — time to accuracy measured end to end (:mod:`.compression_e2e`): a small CNN on
  sklearn digits, every method x seed on the same ranks, on whatever link the ranks have.

Example (what the bench runs on each rank of a 2-rank emulated cluster)::

    PYTHONPATH=benchmarks python -m hetero_bench.compression_worker steptime --out /tmp/st.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_bench._ranks import gloo_job
from hetero_bench.compression_e2e import converge, interface_tx_bytes
from hetero_strategy.config import CompressionConfig, HeteroConfig
from hetero_strategy.hooks import (
    CompressedState,
    PowerSGDBaselineState,
    build_comm_hook,
    powersgd_weighted_hook,
    topk_hook,
)
from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

__all__ = ["ALIASES", "HETERO", "METHODS", "main", "make_hook"]

# plain DDP, DDP + torch's fp16 hook, DDP + torch's PowerSGD (rank 4, and the ranks the best is
# sought among), then this project's hooks; "auto" measures and picks when it is built
METHODS = ("ddp", "ddp_fp16", "ddp_powersgd", "ddp_powersgd_r1", "ddp_powersgd_r2", "ddp_powersgd_r8",
           "topk", "topk_allreduce", "tiered", "auto")
#: the names earlier results and scripts use
ALIASES = {"dense_fp32": "ddp", "fp16": "ddp_fp16", "powersgd": "ddp_powersgd"}
HETERO = ("topk", "topk_allreduce", "tiered", "auto")  # the methods that take hetero batch sizes


class _Counter(WeightedReduceState):
    """Byte counting for PyTorch's fp16 hook, which does not count (the weighted hook counts itself)."""

    __slots__ = ["_acc"]

    def __init__(self) -> None:
        super().__init__(None)
        self._acc = 0


def _count(state: _Counter, bucket, element_size: int) -> None:
    w = dist.get_world_size()
    state._acc += 2 * (w - 1) * bucket.buffer().numel() * element_size // w  # ring all-reduce
    if bucket.is_last():
        state.last_bytes_sent, state._acc = state._acc, 0


def _fp16_hook(state: _Counter, bucket):  # unannotated: postponed annotations in this file
    """PyTorch's own fp16_compress_hook, the baseline as users know it."""
    _count(state, bucket, 2)
    return default_hooks.fp16_compress_hook(None, bucket)


def make_hook(method: str, steps: int, warmup: int | None = None, tiers: list[str] | None = None,
              base_density: float | None = None, overrides: dict | None = None, fallback: bool = True,
              min_density: float | None = None, model: nn.Module | None = None):
    """(state, hook, bucket_cap_mb) of a benchmark method (or an alias); None fields keep the
    config defaults; ``auto`` measures ``model`` (collective)."""
    method = ALIASES.get(method, method)
    if method == "ddp":
        return WeightedReduceState(None), weighted_allreduce_hook, 25
    if method == "ddp_fp16":
        return _Counter(), _fp16_hook, 25
    if method.startswith("ddp_powersgd"):
        # NOTE: one bucket: upstream PowerSGD chains all-reduces in callbacks and aborts on gloo
        # with several buckets (collective order differs across ranks)
        rank = int(method.rpartition("_r")[2]) if "_r" in method[len("ddp_powersgd"):] else 4
        return PowerSGDBaselineState(rank=rank, start_iter=2), powersgd_weighted_hook, 1000
    fields: dict = {"dense_fallback": fallback}
    if warmup is not None:
        fields["dense_warmup_steps"] = warmup
    if method == "auto":  # NOTE: after the warm-up field: the step-time job times steps 3-7
        state, hook = build_comm_hook(HeteroConfig.from_flat(compression="auto", **fields), model=model,
                                      announce=lambda m: print(m, flush=True))
        return state, hook, 25
    if method in ("topk", "topk_allreduce"):
        cfg = CompressionConfig(method=method, base_density=0.01, density_schedule="constant", **fields)
        return CompressedState(cfg, max_steps=steps), topk_hook, 25
    if base_density is not None:
        fields.update(base_density=base_density, min_density=min(0.001, base_density))
    if min_density is not None:
        fields["min_density"] = min_density
    cfg = CompressionConfig(method="tiered", tiers=tiers, tier_overrides=overrides, **fields)
    return CompressedState(cfg, max_steps=steps), topk_hook, 25


def _steptime(args: argparse.Namespace, make_hook) -> dict:
    from torchvision.models import resnet18

    x = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(dist.get_rank()))
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(7))
    runs = {}
    for m in args.methods:
        torch.manual_seed(0)
        net = resnet18(num_classes=10)
        state, hook, cap = make_hook(m, steps=1000, warmup=1, model=net)
        model = DDP(net, bucket_cap_mb=cap)
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
        for _ in range(3 if "powersgd" in m else 2):
            step(m)
    out = {m: {"step_s": [], "bytes": [], "wire_bytes": [], "density": [], "dense_fallback": []} for m in args.methods}
    for _ in range(args.rounds):
        for m in args.methods:
            # NOTE: with --block B the first step brings m's model back into cache; the round's figure is the
            # mean of the other B-1 (a codec that alternates between two kinds of step is seen whole with B=3)
            times, wire, sent = [], [], []
            for _ in range(args.block):
                tx = interface_tx_bytes()
                times.append(step(m))
                wire.append(interface_tx_bytes() - tx)  # the step's collectives are done
                sent.append(int(getattr(runs[m][1], "last_bytes_sent", 0)))
            kept = slice(1, None) if args.block > 1 else slice(None)
            out[m]["step_s"].append(statistics.fmean(times[kept]))
            out[m]["wire_bytes"].append(statistics.fmean(wire[kept]))
            out[m]["bytes"].append(statistics.fmean(sent[kept]))
            out[m]["density"].append(float(getattr(runs[m][1], "density", 1.0)))
            out[m]["dense_fallback"].append(float(getattr(runs[m][1], "dense_fallback", 0.0)))
    out["_tier"] = getattr(runs.get("tiered", (None, None))[1], "tiers", None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="compression_worker")
    p.add_argument("job", choices=["steptime", "converge"])
    p.add_argument("--out", required=True, help="rank 0 writes its JSON here")
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--rounds", type=int, default=5, help="timed steps per method (alternating)")
    p.add_argument("--block", type=int, default=1,
                   help="steptime: consecutive steps per method and round, the mean of all but the first "
                        "reported (default 1: methods alternate step by step; more: as training runs, warm)")
    p.add_argument("--steps", type=int, default=300, help="convergence budget (steps)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--target", type=float, default=0.93)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--warmup", type=int, default=None, help="dense warm-up steps of topk/tiered (default: config's)")
    p.add_argument("--base-density", type=float, default=None, help="tiered policy's base density (default: config's)")
    p.add_argument("--min-density", type=float, default=None, help="tiered policy's density floor")
    p.add_argument("--charge-link", type=float, default=None,
                   help="converge without a real slow link: add the hook's bytes at this rate (bit/s) to the clock")
    p.add_argument("--no-fallback", action="store_true",
                   help="compress even where it does not pay (dense_fallback=False): with --charge-link")
    p.add_argument("--hetero-batches", action="store_true",
                   help="converge: the hetero methods split the global batch by each rank's measured speed")
    p.add_argument("--batch", type=int, default=32, help="converge: mean batch per rank")
    p.add_argument("--tier-overrides", type=json.loads, default=None,
                   help='tiered policy overrides as JSON, e.g. {"eth1g": {"exchange_every": 1}}')
    args = p.parse_args(argv)
    hooks = functools.partial(make_hook, base_density=args.base_density, overrides=args.tier_overrides,
                              fallback=not args.no_fallback, warmup=args.warmup, min_density=args.min_density)
    return gloo_job(args.out, lambda: _steptime(args, hooks) if args.job == "steptime" else converge(args, hooks))

if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
