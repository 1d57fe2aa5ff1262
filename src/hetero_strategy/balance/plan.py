"""Predict a cluster's step time before launch, per method (``hetero-strategy plan``; docs/planner.md).

Per rank r: samples/s = efficiency x peak TFLOP/s / FLOPs per sample, plus the node's fixed cost,
as the probe's affine :class:`~hetero_strategy.balance.probe.StepCost`. Per method:

* ``ddp``: equal batches, dense all-reduce;
* ``ddp_powersgd``: equal batches, torch's PowerSGD at rank 4;
* ``hetero``: batches from :func:`~hetero_strategy.balance.shares.split_batch_timed`, dense;
* ``hetero_auto``: the same split, with the codec ``compression="auto"`` picks
  (:func:`hetero_strategy.hooks.auto.choose`) for the measurement this cluster would give, its
  work counted in each rank's fixed cost (as the probe counts it).

Every time comes from the cost model (:mod:`hetero_strategy.cluster.cost`): the slowest rank's
compute and codec work, plus the exchange backward does not hide. On a gloo cluster of CPU ranks
the all-reduce's host work (its measured time less the link's share) runs on each rank's own core
(:func:`~hetero_strategy.balance.plan_ranks.on_core`): in every rank's compute, and in the hetero split, not hidden.

Example::

    result = plan(read_cluster(["cluster.yaml"]), describe_model("resnet50"), global_batch=256)
    result["methods"]["hetero"]["samples_per_s"]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hetero_strategy.balance.memory import MemoryCost
from hetero_strategy.balance.plan_ranks import (
    CODEC_BYTES_PER_ENTRY,
    codec_seconds,
    exchange_on_core,
    half_ratio,
    on_core,
    per_rank,
    reduction_seconds,
    step_costs,
)
from hetero_strategy.balance.shares import least_share, split_batch, split_batch_timed
from hetero_strategy.cluster.cost import effective_link, exchange_seconds, step_seconds
from hetero_strategy.cluster.model import ModelCost
from hetero_strategy.cluster.spec import PlanCluster, RankDevice
from hetero_strategy.cluster.wire import bytes_per_rank, framing_of
from hetero_strategy.config import BalanceConfig, ConfigError
from hetero_strategy.hooks.auto import STEP_FACTORS, AutoMeasurement, Candidate, buckets_of, choose

__all__ = ["CODEC_BYTES_PER_ENTRY", "METHODS", "STATIC_BYTES_PER_PARAMETER", "MethodPlan", "memory_caps", "plan",
           "plan_methods", "predict", "scale"]

METHODS = ("ddp", "ddp_powersgd", "hetero", "hetero_auto")

#: Bytes per parameter a DDP rank holds whatever its batch: fp32 weights, gradients, DDP's bucket
#: copy of them and SGD's momentum (the recipes' optimizer; Adam's two moments would add 4 more).
STATIC_BYTES_PER_PARAMETER = 16.0


@dataclass
class MethodPlan:
    batch_sizes: list[int]
    codec: str
    compute_s: float
    """The slowest rank's forward, backward and codec work, and on CPU ranks the exchange's host
    work on its core (:func:`~hetero_strategy.balance.plan_ranks.on_core`)."""
    comm_s: float
    """The whole exchange as the profile's all-reduce measured it, its host share included (on CPU
    ranks that share, or DDP's measured exchange where profiled, is in ``compute_s``: the step is
    not their sum)."""
    step_s: float
    samples_per_s: float
    bytes_per_rank: float
    """Payload: what the hooks count (``comm/bytes_sent``)."""
    wire_bytes_per_rank: float
    """The payload with the transport's headers (:func:`~hetero_strategy.cluster.wire.framing_of`)."""
    step_factor: float = 1.0
    """Steps to the same accuracy relative to dense (``compression="auto"``'s table)."""
    passes: list[int] | None = None
    """Forward/backward passes per rank where its share exceeds its memory cap (micro-batching)."""


def memory_caps(cluster: PlanCluster, model: ModelCost, margin: float | None = None) -> list[int | None]:
    """Each rank's largest pass (samples) that fits its device's memory less ``margin`` (the
    runtime's ``memory_margin``), by the probe's memory model (:class:`~.memory.MemoryCost`):
    :data:`STATIC_BYTES_PER_PARAMETER` fixed, the model's activations per sample; None where the
    device's memory is unknown.

    Raises:
        ConfigError: a rank whose device cannot hold the model with even one sample.
    """
    margin = BalanceConfig().memory_margin if margin is None else margin

    def cap(r: RankDevice) -> tuple[int | None, MemoryCost]:
        cost = MemoryCost(STATIC_BYTES_PER_PARAMETER * model.parameters, model.activation_bytes_per_sample,
                          r.memory_bytes)
        return cost.cap(margin), cost

    caps = per_rank(cluster, cap)
    for k, (r, (c, cost)) in enumerate(zip(cluster.ranks, caps)):
        if c == 0:
            raise ConfigError(f"rank {k} ({r.card}, {r.memory_bytes / 2**30:.1f} GiB) cannot hold model={model.name!r}: "
                              f"{cost.bytes(1) / 2**30:.1f} GiB for one sample; plan a smaller model or shard it (FSDP2)")
    return [c for c, _ in caps]


def _measurement(cluster: PlanCluster, model: ModelCost) -> AutoMeasurement:
    """What ``compression="auto"`` would measure on this cluster: the all-reduce as a flat ring,
    the slowest rank's codec work."""
    link, w = effective_link(cluster.topology), cluster.world
    factor = 2 * (w - 1) / w
    n, eff = max(model.parameters, 1), cluster.efficiency

    def slowest(c: Candidate) -> float:
        return _slowest(cluster.ranks, lambda r: codec_seconds(c, r, model, eff, paid=False))

    return AutoMeasurement(
        link_bytes_per_s=link.bytes_per_s / factor, latency_s=link.latency_s * 2 * (w - 1),
        topk_s_per_entry={d: slowest(Candidate("topk_allreduce", density=d)) / n for d in (0.05, 0.01)},
        cast_s_per_entry=slowest(Candidate("fp16")) / n,
        powersgd_s={k: slowest(Candidate("powersgd", rank=k)) for k in (1, 2, 4, 8)},
        backend=cluster.backend, fp16_time_ratio=half_ratio(cluster))


def _slowest(ranks: tuple[RankDevice, ...], seconds) -> float:
    return max(seconds(r) for r in set(ranks))


def _method(cluster: PlanCluster, model: ModelCost, global_batch: int, candidate: Candidate, even: bool,
            buckets: list, caps: list[int | None], step_factor: float = 1.0) -> MethodPlan:
    w = cluster.world
    costs = step_costs(cluster, model)
    density, rank = candidate.density or 0.01, candidate.rank or 4
    link = effective_link(cluster.topology) if w > 1 else None

    def exchange(part: list) -> float:
        return exchange_seconds(candidate.codec, part, w, link, density, rank, half_ratio(cluster)) if w > 1 else 0.0

    comm = exchange(buckets)
    reduction = reduction_seconds(candidate, buckets, w, link, cluster)
    host_work = on_core(cluster, model, candidate, buckets, reduction)
    work = [x + y for x, y in zip(per_rank(cluster, lambda r: codec_seconds(candidate, r, model, cluster.efficiency)),
                                  host_work)]
    if even:
        sizes = split_batch(global_batch, [1.0] * w)
    else:
        sizes = split_batch_timed(global_batch, [c.samples_per_s for c in costs],
                                  [c.fixed_s + x for c, x in zip(costs, work)], min_per_rank=least_share(global_batch, w))
    compute = max(c.seconds(b) + x for c, b, x in zip(costs, sizes, work))
    # what is left of the measured exchange, less the host share it paid, is the link's: it may hide
    # under backward, its last bucket's may not
    host = reduction if exchange_on_core(cluster) else 0.0
    tail = exchange(buckets[-1:]) - (reduction_seconds(candidate, buckets[-1:], w, link, cluster) if host else 0.0)
    # NOTE: torch's PowerSGD runs in one bucket on gloo (it aborts with several): all of it follows backward
    one_bucket = candidate.codec == "powersgd" and cluster.backend == "gloo"
    step = step_seconds(compute, comm - host, cluster.overlap, tail_s=comm - host if one_bucket else tail)
    sent = bytes_per_rank(candidate.codec, buckets, w, density=density, powersgd_rank=rank)
    framing = sum(framing_of(t) for t in cluster.tiers) / w
    passes = [1 if cap is None else max(1, math.ceil(b / cap)) for b, cap in zip(sizes, caps)]
    return MethodPlan(sizes, candidate.label, compute, comm, step, global_batch / step, sent, sent * framing, step_factor,
                      passes)


def predict(cluster: PlanCluster, model: ModelCost, global_batch: int, codec: str, even: bool = True,
            density: float = 0.01, rank: int = 4) -> MethodPlan:
    """One exchange ``codec`` (:data:`~hetero_strategy.cluster.wire.CODECS`; Top-K at ``density``,
    PowerSGD at ``rank``) with equal batches, or the hetero split (``even=False``)."""
    return _method(cluster, model, global_batch, Candidate(codec, density if "topk" in codec else None,
                                                             rank if codec == "powersgd" else None),
                   even, buckets_of(model.shapes), memory_caps(cluster, model))


def plan_methods(cluster: PlanCluster, model: ModelCost, global_batch: int) -> dict[str, MethodPlan]:
    """Each method's predicted split, times and bytes on ``cluster``.

    Raises:
        ConfigError: a rank that cannot hold the model (:func:`memory_caps`).
    """
    caps = memory_caps(cluster, model)  # NOTE: first: a model no rank holds is refused before modelling time
    buckets = buckets_of(model.shapes)
    out = {"ddp": _method(cluster, model, global_batch, Candidate("dense"), True, buckets, caps),
           "ddp_powersgd": _method(cluster, model, global_batch, Candidate("powersgd", rank=4), True, buckets, caps,
                                   STEP_FACTORS["powersgd rank 4"]),
           "hetero": _method(cluster, model, global_batch, Candidate("dense"), False, buckets, caps)}
    if cluster.world > 1:
        # NOTE: compute_s=0, as a run's compression="auto" decides (build_comm_hook passes no compute):
        # this predicts the codec a run gets, not the one that would minimise steps x step time
        d = choose(_measurement(cluster, model), buckets, cluster.world, list(cluster.tiers), compute_s=0.0)
        c = Candidate(d.codec, d.density, d.rank)
    else:
        c = Candidate("dense")
    out["hetero_auto"] = _method(cluster, model, global_batch, c, False, buckets, caps, STEP_FACTORS[c.label])
    return out


def plan(cluster: PlanCluster, model: ModelCost, global_batch: int) -> dict:
    """The planner's answer as a JSON-ready dict with stable keys (docs/planner.md)."""
    methods = plan_methods(cluster, model, global_batch)
    sps = {m: p.samples_per_s for m, p in methods.items()}
    return {
        "schema": "hetero_strategy.plan/1",
        "model": {"name": model.name, "parameters": model.parameters, "flops_per_sample": model.flops_per_sample,
                  "buckets": len(buckets_of(model.shapes))},
        "cluster": {"world": cluster.world, "efficiency": cluster.efficiency, "overlap": cluster.overlap,
                    "backend": cluster.backend,
                    "ranks": [dict(asdict(r), rank=i, tier=t) for i, (r, t) in enumerate(zip(cluster.ranks, cluster.tiers))]},
        "global_batch": global_batch,
        "memory_caps": memory_caps(cluster, model),
        "methods": {m: asdict(p) for m, p in methods.items()},
        "speedup": {"hetero_vs_ddp": sps["hetero"] / sps["ddp"], "hetero_auto_vs_ddp": sps["hetero_auto"] / sps["ddp"],
                    "hetero_vs_ddp_powersgd": sps["hetero"] / sps["ddp_powersgd"],
                    "hetero_auto_vs_ddp_powersgd": sps["hetero_auto"] / sps["ddp_powersgd"]},
        "ranked": sorted(sps, key=lambda m: -sps[m]),
    }


def scale(cluster: PlanCluster, model: ModelCost, per_rank_batch: int, max_world: int = 1024) -> dict:
    """The mix replicated 1, 2, 4 ... times up to ``max_world`` ranks, the mean per-rank batch kept:
    {"worlds": [...], "methods": {method: {"samples_per_s": [...], "bytes_per_rank": [...], "codec": [...]}}}."""
    out: dict = {"worlds": [], "methods": {m: {"samples_per_s": [], "bytes_per_rank": [], "codec": []} for m in METHODS}}
    times = 1
    while cluster.world * times <= max_world:
        big = cluster.replicated(times)
        if big.world >= 2:
            out["worlds"].append(big.world)
            for m, p in plan_methods(big, model, per_rank_batch * big.world).items():
                row = out["methods"][m]
                row["samples_per_s"].append(p.samples_per_s)
                row["bytes_per_rank"].append(p.bytes_per_rank)
                row["codec"].append(p.codec)
        times *= 2
    return out
