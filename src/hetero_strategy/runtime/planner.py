"""The static plan: which per-rank batch sizes a run starts from (docs/design.md semantics 1 and 4).

One policy for every adapter, in order of precedence:

1. explicit ``batch_sizes``;
2. ``capacities``, split in proportion (with the per-rank memory caps);
3. measured compute (the probe on the real model) with a profile's link bandwidth: the capacity
   model alpha * compute + beta * bandwidth, split in proportion;
4. measured compute alone: the affine step cost (fixed + b / rate) of every rank, split so the
   predicted step times are equal; evenly when the ranks' times at the even share agree within
   their measured noise (``balance.timing.equal_within_noise``);
5. equal shares when the probe cannot run (e.g. manual optimization), with a warning.

Steps 3-5 are collective: every rank must call :func:`plan_batch_sizes` with the same config.
:func:`plan_train_loader` applies the plan to the user's training loader: the probe on the real
model at B and B/2, the hetero sampler, and the online balancer when ``calibrate`` is on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader

from hetero_strategy.balance import HeteroBatchSampler, capacity, least_share, split_batch, split_batch_timed
from hetero_strategy.balance.memory import MemoryCost, memory_limit_bytes
from hetero_strategy.balance.online import OnlineBalancer
from hetero_strategy.balance.probe import ProbeExchange, StepCost
from hetero_strategy.balance.timing import equal_within_noise
from hetero_strategy.config import BalanceConfig, CompressionConfig, ConfigError, HeteroConfig
from hetero_strategy.dist import all_gather_floats
from hetero_strategy.runtime.loaders import (
    check_sample_cost,
    hetero_train_loader,
    probe_batch,
    train_loader_batch_size,
)

__all__ = ["Measure", "PlannedLoader", "gather_step_costs", "memory_caps", "plan_batch_sizes", "plan_train_loader",
           "probe_exchange", "profile_bandwidth"]

log = logging.getLogger("hetero_strategy")
_UNPROBED = StepCost(1.0)  # every rank's stand-in cost when some rank could not probe: equal shares

Probe = Callable[[], "StepCost | None"]
Say = Callable[[str], None]
# measure(batches, exchange) -> this rank's StepCost, or None when the model cannot be probed.
Measure = Callable[[list[tuple[Any, int]], ProbeExchange], "StepCost | None"]


class PlannedLoader(NamedTuple):
    """The training loader rebuilt around the plan, its sampler, and the online balancer (or None)."""

    loader: DataLoader
    sampler: HeteroBatchSampler
    balancer: OnlineBalancer | None
    memory_caps: list[int] | None = None
    """Per-rank samples per pass from the probe's memory (None: max_batch_sizes given, or no limit known)."""
    memory: list[Any] | None = None
    """Every rank's probed MemoryCost (None where it was not measured), when the probe ran."""


def plan_train_loader(config: HeteroConfig, rank: int, world_size: int, loader: DataLoader, *, seed: int,
                      measure: Measure | None = None, shuffle: bool | None = None, all_ranks: bool = False,
                      accumulate: int = 1, info: Say = log.info, warn: Say = log.warning) -> PlannedLoader:
    """``loader`` with capacity-sized slices of each global batch G = B x world size (collective
    when it probes); see :meth:`HeteroRuntime.train_loader <hetero_strategy.runtime.HeteroRuntime.train_loader>`."""
    batch = train_loader_batch_size(loader)
    check_sample_cost(config, accumulate)
    global_batch = batch * world_size
    config.balance.check_world_size(world_size, global_batch)
    probe = None if measure is None else lambda: _probe(config, loader, batch, measure)
    probed: list[StepCost] = []
    sizes = plan_batch_sizes(config.balance, world_size, global_batch, probe, info, warn, on_costs=probed.extend)
    # NOTE: max_batch_sizes caps a pass, not a share: a larger share runs as passes (runtime/micro.py)
    loader, sampler = hetero_train_loader(loader, sizes, None if all_ranks else rank, seed, shuffle,
                                          config.balance.sample_cost, config.balance.loss_normalization)
    balancer = None
    if config.calibration.calibrate:
        from hetero_strategy.balance.calibrator import Calibrator

        fixed = [accumulate * c.fixed_s for c in probed] or None  # the probe's fit, per optimizer step
        balancer = OnlineBalancer(Calibrator(config.calibration, sizes, fixed), sampler, accumulate)
    if accumulate > 1 and not loader.drop_last and len(loader.dataset) % global_batch:
        warn(f"hetero: accumulating {accumulate} micro-batches with a partial last batch "
             f"({len(loader.dataset)} samples, global batch {global_batch}): the window holding it is "
             "weighted by its last micro-batch, so it is not exactly the one-process step. Use "
             "drop_last=True, or a dataset length divisible by the global batch, for exact semantics")
    caps = None if config.balance.max_batch_sizes is not None else memory_caps(probed, config.balance, global_batch)
    if caps is not None:
        info("hetero: memory caps per rank (samples per pass, limit less "
             f"{config.balance.memory_margin:.0%}): {caps}; probed (fixed MB, MB per sample, limit MB): "
             f"{[_mb(c.memory) for c in probed]}")
    return PlannedLoader(loader, sampler, balancer, caps, [c.memory for c in probed] or None)


def memory_caps(costs: list[StepCost], cfg: BalanceConfig, global_batch: int) -> list[int] | None:
    """Each rank's largest pass within its memory limit less ``memory_margin`` (the global batch where
    its limit is unknown); None when no rank's limit is known."""
    if not costs or all(c.memory is None or c.memory.limit_bytes is None for c in costs):
        return None
    caps = [c.memory.cap(cfg.memory_margin) if c.memory is not None else None for c in costs]
    for rank, (cap, cost) in enumerate(zip(caps, costs)):
        if cap == 0:
            fixed, per_sample, limit = _mb(cost.memory)
            raise ConfigError(
                f"rank {rank}: not one sample fits its memory: {fixed} MB of parameters, gradients and state "
                f"plus {per_sample} MB per sample against a limit of {limit} MB less memory_margin="
                f"{cfg.memory_margin}. Shard the model (strategy='hetero_fsdp', or FSDP2 under Accelerate), "
                "lower memory_margin, or raise the rank's memory limit")
    return [min(global_batch, cap) if cap is not None else global_batch for cap in caps]


def _mb(memory: Any) -> tuple[float, ...]:
    if memory is None:
        return ()
    limit = -1.0 if memory.limit_bytes is None else memory.limit_bytes / 2**20
    return round(memory.fixed_bytes / 2**20, 1), round(memory.per_sample_bytes / 2**20, 3), round(limit)


def _fitting_pass(config: HeteroConfig, loader: DataLoader, batch: int, measure: Measure) -> float:
    """The largest pass every rank's memory holds, from a first probe at B/8 and B/4 (inf: no limit known).

    NOTE: a rank under a cgroup limit is killed, not told, when a step exceeds it, so the probe's
    own steps at B and B/2 must fit first; on CUDA they would fail the probe just the same."""
    limited = memory_limit_bytes(torch.device("cpu")) is not None or torch.cuda.is_initialized()
    if batch < 8 or not any(flag for (flag,) in all_gather_floats([float(limited)])):
        return math.inf
    cost = measure([(probe_batch(loader, n), n) for n in sorted({batch // 4, batch // 8}, reverse=True)],
                   probe_exchange(config.compression))
    cap = None if cost is None or cost.memory is None else cost.memory.cap(config.balance.memory_margin)
    fits = min(c for (c,) in all_gather_floats([math.inf if cap is None else float(cap)]))
    return max(1.0, fits)


def _probe(config: HeteroConfig, loader: DataLoader, batch: int, measure: Measure) -> StepCost | None:
    # B and B/2, counted as the probe batches really hold them (the data may be shorter than B);
    # a single size when they coincide, so no size is timed twice.
    # Within every rank's per-pass cap (the same counts on every rank: the probe is collective).
    size = min([len(loader.dataset), *(config.balance.max_batch_sizes or [])])
    if config.balance.max_batch_sizes is None:
        size = int(min(size, _fitting_pass(config, loader, batch, measure)))
    first, second = min(batch, size), min(max(1, batch // 2), size)
    counts = sorted({first, second if second < first else max(1, first // 2)}, reverse=True)
    return measure([(probe_batch(loader, n), n) for n in counts], probe_exchange(config.compression))


def plan_batch_sizes(cfg: BalanceConfig, world_size: int, global_batch: int, probe: Probe | None,
                     info: Say = log.info, warn: Say = log.warning,
                     on_costs: Callable[[list[StepCost]], None] | None = None) -> list[int]:
    """Per-rank batch sizes summing to ``global_batch`` (see the module docstring for the policy).

    ``probe`` measures this rank's :class:`StepCost` on the real model (None: cannot probe);
    ``info`` and ``warn`` report what was measured and decided; ``on_costs`` receives every
    rank's probed cost when a probe ran (the calibrator keeps their fixed parts).
    """
    cfg.check_world_size(world_size, global_batch)
    if cfg.batch_sizes is not None:
        return list(cfg.batch_sizes)
    if cfg.capacities is not None:
        return split_batch(global_batch, cfg.capacities)
    costs = gather_step_costs(probe() if probe is not None else None, world_size, info, warn)
    if on_costs is not None:
        on_costs(costs)
    # NOTE: compared at the even share, the size every rank would take if they were equal; within
    # their measured noise the probe says nothing about which rank is faster, so it splits evenly
    # (two identical CPU ranks were split [57, 7] by noise alone before).
    even = global_batch / world_size
    equal = len(costs) > 1 and equal_within_noise([c.seconds(even) for c in costs], [c.spread for c in costs])
    if costs[0] is not _UNPROBED:
        info(f"hetero: probed at {even:g} samples per rank: {_speeds(costs, even)} samples/s → "
             + ("treated as equal" if equal else "split by speed"))
    bandwidth = profile_bandwidth(cfg.profile, world_size)
    if bandwidth is not None:
        compute = [1.0] * world_size if equal else [c.samples_per_s for c in costs]
        return split_batch(global_batch, capacity(compute, bandwidth, cfg.alpha, cfg.beta))
    if equal:
        return split_batch(global_batch, [1.0] * world_size)
    return split_batch_timed(global_batch, [c.samples_per_s for c in costs], [c.fixed_s for c in costs],
                             min_per_rank=least_share(global_batch, world_size))


def _speeds(costs: list[StepCost], batch: float) -> str:
    """``176.9k ± 2% vs 62.6k ± 40%``: each rank's samples/s at ``batch`` and its relative noise."""
    def one(c: StepCost) -> str:
        rate = batch / c.seconds(batch)
        text = f"{rate / 1000:.1f}k" if rate >= 1000 else f"{rate:.1f}"
        return f"{text} ± {100 * c.spread:.0f}%"
    return " vs ".join(one(c) for c in costs)


def probe_exchange(cfg: CompressionConfig) -> ProbeExchange:
    """What of the gradient exchange the probe times with each step, from the compression config."""
    if cfg.method in ("topk", "topk_allreduce", "tiered"):
        # Top-K's encode runs on every rank at every step and is per-entry work, not per-sample: a
        # slow rank pays it slower, so the plan must count it (its payload is too small to compete).
        return ProbeExchange(dense=False, codec_density=cfg.base_density, codec_backend=cfg.compression_backend)
    # A dense exchange overlapped with backward competes with it on gloo: probe beside one.
    # Deferred (after backward) or compressed (small) exchanges leave the compute alone.
    return ProbeExchange(dense=cfg.method == "none" and cfg.overlap_comm)


def gather_step_costs(cost: StepCost | None, world_size: int, info: Say = log.info,
                      warn: Say = log.warning) -> list[StepCost]:
    """Every rank's probed cost (one all-gather); equal costs when any rank could not probe."""
    # NOTE: every rank must join the all-gather, also one that could not probe (cost None).
    rows = all_gather_floats([-1.0, 0.0, 0.0, *_memory_row(None)] if cost is None
                             else [cost.samples_per_s, cost.fixed_s, cost.spread, *_memory_row(cost.memory)])
    if min(row[0] for row in rows) <= 0:
        warn("hetero: could not probe the model's step on every rank; using equal shares. "
                    "Pass batch_sizes=... or capacities=... to set the split yourself.")
        return [_UNPROBED] * world_size
    costs = [StepCost(rate, fixed, None if has < 0 else MemoryCost(m_fixed, per, None if limit < 0 else limit), spread)
             for rate, fixed, spread, has, m_fixed, per, limit in rows]
    info("hetero: probed per rank (samples/s, fixed ms per step): "
         f"{[(round(c.samples_per_s, 1), round(1000 * c.fixed_s, 1)) for c in costs]}")
    return costs


def _memory_row(memory: MemoryCost | None) -> list[float]:
    """(measured, fixed bytes, bytes per sample, limit or -1) for the all-gather."""
    if memory is None:
        return [-1.0, 0.0, 0.0, -1.0]
    return [1.0, memory.fixed_bytes, memory.per_sample_bytes, -1.0 if memory.limit_bytes is None else memory.limit_bytes]


def profile_bandwidth(path: str | None, world_size: int) -> list[float] | None:
    """Per-rank link bandwidth (Gbit/s) from a cluster profile JSON, or None without one."""
    if path is None:
        return None
    from hetero_strategy.cluster.profile import load_profile

    bandwidth = load_profile(path).bandwidth_gbit_s
    if len(bandwidth) != world_size:
        raise ConfigError(f"profile={path!r} is invalid: it describes {len(bandwidth)} ranks but the job has "
                          f"{world_size}; profile this cluster with `hetero-strategy profile --json`")
    return bandwidth
