"""What each rank pays per step, for the planner (balance/plan.py): its compute, its codec work, and
on CPU ranks the exchange's host work on its own core (docs/planner.md, "The model behind the numbers")."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from hetero_strategy.balance.probe import StepCost
from hetero_strategy.cluster.cost import Link, collective_seconds
from hetero_strategy.cluster.model import ModelCost
from hetero_strategy.cluster.spec import PlanCluster, RankDevice
from hetero_strategy.cluster.wire import collectives, ring_traffic
from hetero_strategy.hooks.auto import Candidate

__all__ = ["CODEC_BYTES_PER_ENTRY", "codec_seconds", "exchange_on_core", "half_ratio", "matmul_efficiency", "on_core",
           "per_rank", "powersgd_flops", "reduction_seconds", "step_costs", "timed"]

T = TypeVar("T")

#: Memory traffic per gradient entry of the codecs' element-wise work, which memory bandwidth
#: bounds: Top-K with error feedback reads the gradient and residual, writes the accumulator,
#: reads it for the non-finite marker and the selection passes, and writes the residual (~10 x 4 B);
#: the fp16 cast reads 4 B, writes 2, and back (12 B).
CODEC_BYTES_PER_ENTRY = {"topk_allreduce": 40.0, "topk": 40.0, "fp16": 12.0}

def per_rank(cluster: PlanCluster, fn: Callable[[RankDevice], T]) -> list[T]:
    """``fn`` of every rank, computed once per distinct device (a 1024-rank --scale replicates a few)."""
    seen = {r: fn(r) for r in set(cluster.ranks)}
    return [seen[r] for r in cluster.ranks]


def timed(r: RankDevice, model: ModelCost) -> bool:
    return r.model_step is not None and r.model_step[0] == model.name


def step_costs(cluster: PlanCluster, model: ModelCost) -> list[StepCost]:
    """Each rank's step: as a profile timed it on this model, else ``efficiency`` x its TFLOP/s."""
    return per_rank(cluster, lambda r: StepCost(r.model_step[1], r.model_step[2]) if timed(r, model) else
                     StepCost(cluster.efficiency * r.tflops * 1e12 / model.flops_per_sample, r.fixed_s))


def matmul_efficiency(r: RankDevice, model: ModelCost, default: float) -> float:
    """The share of its matmul rate a rank's step reaches: measured where a profile timed the model
    (its FLOPs per second over the probe's matmul TFLOP/s), else the cluster's ``efficiency``."""
    if timed(r, model):
        return min(1.0, r.model_step[1] * model.flops_per_sample / (r.tflops * 1e12))
    return default


def codec_seconds(c: Candidate, r: RankDevice, model: ModelCost, efficiency: float, paid: bool = True) -> float:
    """One rank's codec work per step: what a step pays for it (``paid``: the hook under DDP, as a
    profile timed it), else what ``compression="auto"`` measures of it (its stand-ins, which it decides
    from); where the profile did not time this model, bound by memory bandwidth or PowerSGD's matmuls."""
    if timed(r, model):
        for table in ((r.hook_s, r.codec_s) if paid else (r.codec_s,)):
            if c.label in dict(table):
                return dict(table)[c.label]
    if c.codec == "powersgd":
        eff = matmul_efficiency(r, model, efficiency)
        return powersgd_flops(model, c.rank or 4) / (eff * r.fp32_tflops * 1e12)
    return CODEC_BYTES_PER_ENTRY.get(c.codec, 0.0) * model.parameters / (r.memory_gbps * 1e9)


def powersgd_flops(model: ModelCost, rank: int) -> float:
    """M Q, M^T P and the error M - P Q^T on each matrix PowerSGD compresses: 6 x rows x cols x r."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    total = 0.0
    for s in model.shapes:
        rows = s[0] if s else 1
        cols = math.prod(s) // max(rows, 1)
        r = min(rank, rows, cols)
        if _should_compress(rows, cols, r, 2)[0]:
            total += 6.0 * rows * cols * r
    return total


def half_ratio(cluster: PlanCluster) -> float:
    """An fp16 all-reduce's time over an fp32 one's of as many entries: half the bytes cross the
    link, but gloo sums fp16 on the CPU at about fp32's speed; so 0.5 on NCCL, and on gloo 0.5 of
    the share of the time the link takes (a profile's ``wire_share``) plus all of the rest."""
    if cluster.backend == "nccl":
        return 0.5
    share = cluster.wire_share if cluster.wire_share is not None else 0.0
    return 1.0 - 0.5 * share


def _reduced(candidate: Candidate, buckets: list, world: int) -> float:
    """Bytes the exchange's all-reduces reduce per step, at 4 bytes per entry whatever the codec
    sends (gloo sums fp16 at fp32's pace: :func:`half_ratio`); all-gathers reduce nothing."""
    total = 0.0
    for shapes in buckets:
        for kind, payload in collectives(candidate.codec, shapes, world, candidate.density or 0.01,
                                         candidate.rank or 4):
            if kind == "all_reduce":
                total += payload * (2.0 if candidate.codec in ("fp16", "bf16") else 1.0)
    return total


def reduction_seconds(candidate: Candidate, buckets: list, world: int, link, cluster: PlanCluster) -> float:
    """The host's share of the exchange's all-reduces as the profile's all-reduce sweep paid it:
    1 - ``wire_share`` of their bandwidth term (:func:`_reduced`); latency and all-gathers are the
    link's. 0 without a measured ``wire_share`` or a link."""
    if cluster.wire_share is None or link is None:
        return 0.0
    return (1.0 - cluster.wire_share) * collective_seconds("all_reduce", _reduced(candidate, buckets, world), world,
                                                           Link(link.bytes_per_s))


def on_core(cluster: PlanCluster, model: ModelCost, candidate: Candidate, buckets: list, host_s: float) -> list[float]:
    """Each rank's seconds of the exchange's host work on its own core. On a gloo cluster of CPU
    ranks of at most one core each (every ``cpu_share`` known and below 1), gloo reduces and copies
    on the core backward needs, so backward cannot hide it.

    The sweep's rule: ``host_s`` (the all-reduce sweep's host share, :func:`reduction_seconds`),
    paid at the slowest share as the collective measured it, faster by x slowest / its share on a
    rank with more. Where every rank's profile timed ``model`` and measured DDP's dense exchange
    (``exchange_cpu_s``, per unit of ring traffic) and the sweep's link share is known, a rank
    pays the ranks' mean of it x this ring's 2(W-1)/W at its share of a core, less DDP's bucket
    copies (in its codec work already, ``hook_s["dense"]``), scaled to the entries ``candidate``
    reduces, and never less than the sweep's rule: it holds what the all-reduce's own figure
    misses, backward's thread and gloo's disturbing each other on one core. Zero elsewhere (a rank
    reading a whole core may have more, where the reduction need not wait for backward)."""
    if not exchange_on_core(cluster):
        return [0.0] * cluster.world
    shares = [r.cpu_share for r in cluster.ranks]
    sweep = [host_s * min(shares) / s for s in shares]
    if cluster.wire_share is None or not all(r.exchange_cpu_s is not None and timed(r, model) for r in cluster.ranks):
        return sweep
    ratio = _reduced(candidate, buckets, cluster.world) / max(_reduced(Candidate("dense"), buckets, cluster.world), 1.0)
    # NOTE: the ring reduces and copies as many bytes on every rank: one figure, the ranks' mean CPU
    # seconds, each paying it at its share. Each rank's own is a difference of two timings; apart,
    # the 0.57-core rank's read 1.1-2.1x the whole core's in five profiles, and the split followed
    # that noise as far as [62, 2] ([51, 13] from the profile that read them alike)
    cpu = sum(r.exchange_cpu_s for r in cluster.ranks) / cluster.world * ring_traffic("all_reduce", cluster.world)[0]
    measured = per_rank(cluster, lambda r: max(0.0, cpu / r.cpu_share - dict(r.hook_s).get("dense", 0.0)) * ratio)
    return [max(m, s) for m, s in zip(measured, sweep)]


def exchange_on_core(cluster: PlanCluster) -> bool:
    """Whether the exchange's host work runs on the ranks' training cores (:func:`on_core`)."""
    shares = [r.cpu_share for r in cluster.ranks]
    return cluster.backend == "gloo" and cluster.world >= 2 and all(s is not None and 0 < s < 1 for s in shares)
