"""Time to accuracy, measured end to end: one rank's part of ``bench compression``'s convergence run.

A small CNN (283k parameters) learns sklearn's digits on 2 ranks, batch 32 per rank, for every
method x seed in turn (so slow drifts of the machine hit every method alike). The clock runs
over training only: the hook state's construction (its link and codec measurement included),
every step, and the optimizer; the held-out evaluation every ``eval_every`` steps is not timed.
The first evaluation at or above the target gives ``time_to_target_s``; the last one gives
``accuracy`` (after the whole budget). Bytes come from two sources: the hook's own count and the
transmit counter of this rank's interface (``/proc/self/net/dev``: per network namespace, so on
the emulated cluster it is this rank's link alone).

Example (what each rank runs inside the emulated cluster)::

    PYTHONPATH=benchmarks python -m hetero_bench.compression_worker converge --out /tmp/c.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = ["converge", "interface_tx_bytes", "make_cnn"]


def make_cnn() -> nn.Module:
    """Two 3x3 convolutions and two linear layers for 8x8 digits: 283k parameters, 1.1 MB fp32."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10),
    )


def interface_tx_bytes(name: str | None = None) -> int:
    """Bytes sent so far by interface ``name`` (default: GLOO_SOCKET_IFNAME) in this network namespace."""
    name = name or os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    with open("/proc/self/net/dev") as f:  # NOTE: /proc/self/net follows the netns; /sys does not
        for line in f:
            iface, _, counters = line.partition(":")
            if iface.strip() == name:
                return int(counters.split()[8])  # receive: 8 fields, then transmit bytes
    raise RuntimeError(f"interface {name!r} not found in /proc/self/net/dev; set GLOO_SOCKET_IFNAME")


def _digits():
    from hetero_strategy.workloads.digits import digits_datasets

    train, test = digits_datasets(test_fraction=0.3)
    return (*train.tensors, *test.tensors)  # xtr, ytr, xte, yte


def _was_dense(state) -> bool:
    """Whether the step just taken sent dense fp32 gradients (warm-up, periodic sync)."""
    psgd = getattr(state, "powersgd", None)  # torch's PowerSGD state, chosen or by auto
    if psgd is not None:
        return psgd.iter <= psgd.start_powerSGD_iter  # iter counts after the hook
    modes = getattr(state, "last_modes", None)
    return bool(modes) and all(m in ("warmup", "dense", "dense_fallback") for m in modes.values())


def _run_one(method: str, seed: int, args: argparse.Namespace, data, make_hook, sizes: list[int],
             momentum: float) -> dict:
    """One training of ``method``: rank r takes ``sizes[r]`` samples of each global batch; SGD with
    this ``momentum`` (0 where the hook applies momentum itself)."""
    xtr, ytr, xte, yte = data
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    net = make_cnn()
    dist.barrier()
    clock, tx0 = time.perf_counter(), interface_tx_bytes()
    state, hook, cap = make_hook(method, steps=args.steps, tiers=None, model=net)
    model = DDP(net, bucket_cap_mb=cap)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed)
    order, pos, total, lo = torch.randperm(len(xtr), generator=gen), 0, sum(sizes), sum(sizes[:rank])
    trained, hook_bytes, charged, dense_steps = 0.0, 0, 0, 0
    reached = time_to_target = None
    curve = []
    for step in range(1, args.steps + 1):
        if pos + total > len(order):
            order, pos = torch.randperm(len(xtr), generator=gen), 0
        idx = order[pos + lo: pos + lo + sizes[rank]]
        pos += total
        state.set_local_batch(sizes[rank], total)  # b_r / G: the weighted mean (1/W for equal sizes)
        opt.zero_grad()
        nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()
        hook_bytes += int(getattr(state, "last_bytes_sent", 0))
        dense_steps += _was_dense(state)
        if step % args.eval_every == 0:
            trained += time.perf_counter() - clock
            if args.charge_link:  # --simulate-link: the bytes' time on the link, computed
                trained, charged = trained + 8 * (hook_bytes - charged) / args.charge_link, hook_bytes
            with torch.no_grad():  # same weights on every rank: every rank stops alike
                acc = float((net(xte).argmax(1) == yte).float().mean())
            curve.append((step, acc, trained))
            if reached is None and acc >= args.target:
                reached, time_to_target = step, trained
            clock = time.perf_counter()
    wire = interface_tx_bytes() - tx0
    return {"accuracy": curve[-1][1], "steps_to_target": reached, "time_to_target_s": time_to_target,
            "train_time_s": trained, "step_time_s": trained / args.steps, "hook_bytes_per_step": hook_bytes / args.steps,
            "wire_bytes_per_step": wire / args.steps, "dense_steps": dense_steps,
            "dense_fallback": float(getattr(state, "dense_fallback", 0.0)), "curve": curve, "world_size": world,
            "batch_sizes": sizes, "decision": _decision(state)}


def _decision(state) -> dict | None:
    """What compression="auto" chose (None for the fixed methods)."""
    d = getattr(state, "decision", None)
    return None if d is None else {"codec": d.codec, "density": d.density, "rank": d.rank,
                                   "predicted_ms": d.predicted_ms, "tier": d.tier}


def compute_step_s(data, batch: int, steps: int = 20) -> float:
    """This rank's median step without any exchange (no DDP): forward, backward, SGD."""
    xtr, ytr = data[0], data[1]
    net = make_cnn()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    times = []
    for i in range(steps + 2):
        idx = torch.arange(i * batch, (i + 1) * batch) % len(xtr)
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])  # the first steps warm allocations up


def hetero_sizes(data, batch: int) -> list[int]:
    """The global batch (batch x world) split by every rank's measured speed, as hetero sizes it:
    per-sample cost from two batch sizes (the project's probe fit), shares by capacity."""
    from hetero_strategy.balance.probe import fit_step_cost
    from hetero_strategy.balance.shares import split_batch_timed
    from hetero_strategy.dist import all_gather_floats

    cost = fit_step_cost([(b, compute_step_s(data, b, steps=10)) for b in (batch, max(1, batch // 2))])
    rows = all_gather_floats([cost.samples_per_s, cost.fixed_s])
    return split_batch_timed(batch * dist.get_world_size(), [r[0] for r in rows], [r[1] for r in rows])


def converge(args: argparse.Namespace, make_hook, momentum_of: Callable[[str], float] | None = None) -> dict:
    """{method: [per-seed result]} on every rank; wire bytes are the mean over ranks. The hetero
    methods take capacity-sized batches with ``hetero_batches``; "_setup" holds the sizes and
    every rank's compute-only step (for the dense step's communication share).

    ``momentum_of``: the optimizer's momentum per method (default ``args.momentum`` for all), e.g.
    0 where the hook applies momentum itself (``momentum_correction``, :mod:`.dgc`).
    """
    from hetero_bench.compression_worker import HETERO
    from hetero_strategy.dist import all_gather_floats

    momentum = momentum_of or (lambda _: args.momentum)
    data = _digits()
    batch, world = getattr(args, "batch", 32), dist.get_world_size()
    equal = [batch] * world
    hetero = hetero_sizes(data, batch) if getattr(args, "hetero_batches", False) else equal
    compute = [row[0] for row in all_gather_floats([compute_step_s(data, batch)])]
    # NOTE: one untimed run first: the first training in a process pays one-time costs (allocator,
    # gloo connections, lazy imports) that would otherwise land on whichever method runs first
    warm = argparse.Namespace(**{**vars(args), "steps": 2 * args.eval_every, "charge_link": None})
    _run_one(args.methods[0], 0, warm, data, make_hook, equal, momentum(args.methods[0]))
    out: dict[str, list] = {m: [] for m in args.methods}
    for seed in range(args.seeds):
        for m in args.methods:
            r = _run_one(m, seed, args, data, make_hook, hetero if m in HETERO else equal, momentum(m))
            wires = [None] * dist.get_world_size()
            dist.all_gather_object(wires, r["wire_bytes_per_step"])
            r["wire_bytes_per_step"] = sum(wires) / len(wires)
            out[m].append(r)
            if dist.get_rank() == 0:
                print(f"converge {m} seed {seed}: acc {r['accuracy']:.3f}, target at {r['steps_to_target']} "
                      f"({r['time_to_target_s']}) s, {r['step_time_s']:.3f} s/step", flush=True)
    out["_setup"] = {"hetero_batch_sizes": hetero, "equal_batch_sizes": equal, "compute_step_s": compute}
    return out
