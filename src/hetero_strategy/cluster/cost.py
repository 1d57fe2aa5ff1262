"""The cost model: seconds of one training step from the devices, the links, the model and W.

One model for every place that predicts time: ``hetero-strategy plan`` (balance/plan.py),
``compression="auto"`` (hooks/auto.py), the hooks' sparse-or-dense test (hooks/cost.py), the
probe's split (fixed cost + b / rate, balance/probe.py's ``StepCost``) and the figures of a run
(runtime/metrics.py). The bytes behind the seconds are :mod:`.wire`'s.

**Collectives (α–β).** A collective of kind k with payload P on W ranks, over links where one rank
sends β bytes per second and each message on the critical path costs α seconds::

    t = traffic(k, W) x P / β + hops(k, W) x α

with ``traffic`` from :func:`~.wire.ring_traffic` (ring all-reduce 2(W-1)/W, all-gather W-1,
broadcast (W-1)/W) and hops 2(W-1), W-1 and ceil(log2 W) (a tree broadcast). A ring runs at its
slowest edge. On several nodes, the **hierarchical** all-reduce reduce-scatters inside each node,
all-reduces the shards between nodes (through one inter-node link per node, which then carries
2(N-1)/N x P) and all-gathers inside; NCCL takes whichever of ring and hierarchical is faster,
gloo only rings.

**Step.** ``step = max_r (fixed_r + b_r / rate_r + codec_r) + exposed(comm)``: every rank waits
for the slowest; the exchange of every bucket but the last starts during backward, so up to
``overlap`` x compute of it is hidden (:func:`step_seconds`); the last bucket's is not.

Example::

    link = Link(bytes_per_s=1.25e9, latency_s=20e-6)                 # 10 Gbit/s
    collective_seconds("all_reduce", 100e6, world=8, link=link)      # 0.14 s
    step_seconds(compute_s=0.3, comm_s=0.14, overlap=0.5)            # 0.3: hidden by backward
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetero_strategy.cluster.wire import collectives, ring_traffic, wire_entries

__all__ = ["Link", "Topology", "allreduce_seconds", "collective_seconds", "effective_link", "exchange_seconds",
           "ideal_samples_per_s", "sparse_pays", "step_seconds"]


@dataclass(frozen=True)
class Link:
    """A link as the cost model sees it."""

    bytes_per_s: float
    """Bytes one rank sends per second over it (a NIC's rate, not an all-reduce's algorithm bandwidth)."""
    latency_s: float = 0.0
    """Seconds per message on a collective's critical path (α)."""

    @classmethod
    def from_allreduce(cls, algbw_bytes_per_s: float, world: int, allreduce_latency_s: float = 0.0) -> Link:
        """From what a W-rank all-reduce measured: payload bytes per second (algorithm bandwidth)
        and the seconds of a one-entry all-reduce (2(W-1) messages)."""
        factor, hops = ring_traffic("all_reduce", max(world, 2))
        return cls(algbw_bytes_per_s * factor, allreduce_latency_s / hops)

    def slowest(self, other: Link) -> Link:
        """The link a ring over both runs at: the lesser rate, the greater latency."""
        return Link(min(self.bytes_per_s, other.bytes_per_s), max(self.latency_s, other.latency_s))


def _hops(kind: str, world: int) -> float:
    if world < 2:
        return 0.0
    return {"all_reduce": 2.0 * (world - 1), "all_gather": float(world - 1),
            "broadcast": float(math.ceil(math.log2(world)))}[kind]


def collective_seconds(kind: str, payload: float, world: int, link: Link) -> float:
    """α–β seconds of one ring collective (``all_reduce``, ``all_gather``: payload per rank,
    ``broadcast``) of ``payload`` bytes on ``world`` ranks."""
    factor, _ = ring_traffic(kind, world)
    return factor * payload / link.bytes_per_s + _hops(kind, world) * link.latency_s


@dataclass(frozen=True)
class Topology:
    """Ranks grouped by node: how many on each, each node's link inside and its link out."""

    per_node: tuple[int, ...]
    intra: tuple[Link, ...]
    inter: tuple[Link, ...]
    hierarchical: bool = True
    """Whether the all-reduce may go hierarchical (NCCL); gloo rings only."""

    @property
    def world(self) -> int:
        return sum(self.per_node)

    def ring_link(self) -> Link:
        """The edge a flat ring over every rank runs at (nodes kept together, so each node's
        inter-node link carries one edge)."""
        edges = [link for n, link in zip(self.per_node, self.intra) if n > 1]
        if len(self.per_node) > 1:
            edges += list(self.inter)
        edges = edges or list(self.intra)
        out = edges[0]
        for link in edges[1:]:
            out = out.slowest(link)
        return out


def allreduce_seconds(payload: float, topology: Topology) -> float:
    """An all-reduce of ``payload`` bytes: the flat ring, or the hierarchical one when it is
    allowed, there are several nodes and it is faster."""
    ring = collective_seconds("all_reduce", payload, topology.world, topology.ring_link())
    nodes = len(topology.per_node)
    if not topology.hierarchical or nodes < 2:
        return ring
    inside = max(collective_seconds("all_reduce", payload, n, link) for n, link in zip(topology.per_node, topology.intra))
    outer = topology.inter[0]
    for link in topology.inter[1:]:
        outer = outer.slowest(link)
    return min(ring, inside + collective_seconds("all_reduce", payload, nodes, outer))


def effective_link(topology: Topology) -> Link:
    """The flat-ring link that an all-reduce on ``topology`` measures as: what
    ``compression="auto"`` would measure on that cluster (its bandwidth over a large payload,
    its latency at one entry)."""
    latency = allreduce_seconds(0.0, topology)
    big = 1e12  # bytes: large enough that latency is lost in rounding
    algbw = big / (allreduce_seconds(big, topology) - latency)
    return Link.from_allreduce(algbw, topology.world, latency)


def exchange_seconds(codec: str, buckets: Sequence[Sequence[Sequence[int]]], world: int, link: Link,
                     density: float = 0.01, powersgd_rank: int = 4, half_time_ratio: float = 0.5) -> float:
    """Seconds of one step's collectives under ``codec`` (bytes: :func:`~.wire.collectives`),
    each a ring on ``link`` (on several nodes: :func:`effective_link`).

    ``half_time_ratio``: an fp16/bf16 all-reduce's time over an fp32 one's of as many entries
    (0.5 where the link limits; more where the reduction's own arithmetic does, as gloo's).
    """
    total = 0.0
    for shapes in buckets:
        for kind, payload in collectives(codec, shapes, world, density, powersgd_rank):
            if codec in ("fp16", "bf16"):
                payload *= 2.0 * half_time_ratio  # as measured against fp32's 4 bytes per entry
            total += collective_seconds(kind, payload, world, link)
    return total


def sparse_pays(numel: int, capacity: int, world: int, link: Link, codec_s_per_entry: float,
                shared: bool = False) -> bool:
    """Whether sending ``capacity`` entries per rank (plus the codec's work on all ``numel``)
    beats a dense all-reduce of ``numel`` fp32 entries; latency left out (both pay it alike)."""
    bare = Link(link.bytes_per_s)
    dense = collective_seconds("all_reduce", 4.0 * numel, world, bare)
    sparse = codec_s_per_entry * numel + collective_seconds(
        "all_reduce", 4.0 * wire_entries(capacity, world, shared), world, bare)
    return sparse < dense


def step_seconds(compute_s: float, comm_s: float, overlap: float = 0.0, tail_s: float = 0.0) -> float:
    """compute + the exchange's part that backward does not hide.

    ``compute_s`` is the slowest rank's forward, backward and codec work; ``overlap`` in [0, 1] the
    share of it the exchange can run under (0: none, as on one CPU core that does both);
    ``tail_s`` the part of ``comm_s`` that cannot start before backward ends (the last bucket's
    exchange: its gradients are ready last), always exposed::

        compute + tail + (comm - tail) - min(comm - tail, overlap x compute)
    """
    early = max(0.0, comm_s - tail_s)
    return compute_s + comm_s - min(early, overlap * compute_s)


def ideal_samples_per_s(global_batch: int, solo_samples_per_s: Sequence[float], t_ar_s: float) -> float:
    """G / (G / Σ s_r + t_ar): the throughput of a perfectly balanced step that hides no communication."""
    return global_batch / (global_batch / sum(solo_samples_per_s) + t_ar_s)
