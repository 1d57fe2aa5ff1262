"""``compression="auto"``: which codec, at which density or rank, for the exchange's link (docs/choosing-compression.md).

When the hook is built, every rank measures together (:func:`measure`): the link (all-reduce
bandwidth and the latency of a one-entry all-reduce), and each codec's own work on this device
(the Top-K error-feedback pass per entry at each density, the fp16 cast per entry, and torch's
PowerSGD matrix work on *this model's* matrices at each rank). The slowest rank's figure counts,
so every rank computes the same table and takes the same decision.

Per candidate, the predicted seconds of communication per step are the cost model's
(:func:`~hetero_strategy.cluster.cost.exchange_seconds`: α–β per collective, on the bytes of
:mod:`~hetero_strategy.cluster.wire` that ``bench compression-scaling`` checks) plus the codec's
work. A
lossy codec also needs more steps to reach the same accuracy: :data:`STEP_FACTORS` holds steps to
target relative to dense, measured by ``bench compression``. The decision minimises::

    step_factor x (compute_s + predicted comm seconds)

keeping the less lossy candidate (earlier in :data:`CANDIDATES`) unless a later one is predicted
more than :data:`TIE_MARGIN` (10%) better. ``compute_s`` is the step's
compute when the caller knows it (0 otherwise: the comparison is then of communication alone).

The exchange runs at the pace of its slowest link, so the decision is the slowest tier's; ranks
on one host with dense tiers throughout exchange densely only if dense is predicted fastest.

Example::

    meas = measure(None, shapes, backend="auto")               # collective
    decision = choose(meas, buckets_of(shapes), world=2, tiers=["eth1g", "eth1g"])
    decision.describe()        # 'eth1g: powersgd rank 4, 3.1 ms/step predicted (...)'
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

from hetero_strategy.cluster.cost import Link, exchange_seconds
from hetero_strategy.config import TIERS
from hetero_strategy.dist import all_gather_floats, allreduce_seconds, device_for, measure_bandwidth_gbps
from hetero_strategy.hooks.cost import measure_codec_seconds_per_entry

__all__ = [
    "CANDIDATES",
    "STEP_FACTORS",
    "AutoDecision",
    "AutoMeasurement",
    "Candidate",
    "buckets_of",
    "choose",
    "measure",
    "powersgd_seconds",
]


@dataclass(frozen=True)
class Candidate:
    codec: str
    """dense, fp16, powersgd or topk_allreduce."""
    density: float | None = None
    """Top-K density (topk_allreduce)."""
    rank: int | None = None
    """PowerSGD matrix approximation rank."""

    @property
    def label(self) -> str:
        if self.codec == "powersgd":
            return f"powersgd rank {self.rank}"
        return f"{self.codec} density {self.density:g}" if self.density is not None else self.codec


#: least lossy first: a tie goes to the earlier one
CANDIDATES = (
    Candidate("dense"), Candidate("fp16"),
    Candidate("powersgd", rank=8), Candidate("powersgd", rank=4), Candidate("powersgd", rank=2),
    Candidate("powersgd", rank=1),
    Candidate("topk_allreduce", density=0.05), Candidate("topk_allreduce", density=0.01),
)

#: steps to the target accuracy relative to dense fp32 (the decision table). From ``bench
#: compression`` at lr 0.05 (commit f8033a2's compression.json, digits CNN, 3 seeds): fp16 1.0,
#: PowerSGD rank 4 1.12, Top-K 1% 1.9, Top-K 5% (tiered) 1.25; the other PowerSGD ranks are
#: interpolated. At lr 0.0007 (this commit's compression.json) every codec took within 7% of
#: dense's steps: error feedback recovers more at small steps, so these factors are cautious.
STEP_FACTORS = {
    "dense": 1.0, "fp16": 1.0,
    "powersgd rank 8": 1.05, "powersgd rank 4": 1.12, "powersgd rank 2": 1.25, "powersgd rank 1": 1.5,
    "topk_allreduce density 0.05": 1.25, "topk_allreduce density 0.01": 1.9,
}
assert set(STEP_FACTORS) == {c.label for c in CANDIDATES}, "every candidate needs a step factor"

_TOPK_ONLY = ("dense", "topk_allreduce")  # what a hierarchical leaders' exchange can run
TIE_MARGIN = 0.10  # a less lossy candidate is kept unless a later one is predicted this much faster


@dataclass
class AutoMeasurement:
    """What :func:`measure` found (the group's slowest rank), in seconds and bytes per second."""

    link_bytes_per_s: float
    latency_s: float
    topk_s_per_entry: dict[float, float]
    cast_s_per_entry: float
    powersgd_s: dict[int, float]
    backend: str = "gloo"
    fp16_time_ratio: float = 0.5
    """An fp16 all-reduce's time over an fp32 one's of as many entries: about 0.5 where the link
    limits (NCCL), more where the reduction's own arithmetic does (gloo adds fp16 on the CPU)."""


@dataclass
class AutoDecision:
    """The choice, what it rests on, and the cluster it was made for (identical on every rank)."""

    codec: str
    density: float | None
    rank: int | None
    tier: str
    """The exchange's slowest tier, whose link the decision is for."""
    tiers: list[str]
    world: int
    predicted_ms: float
    table: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per candidate: predicted ms of communication per step, step factor, objective (or excluded)."""
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def signature(self) -> tuple[int, tuple[str, ...]]:
        """The cluster the decision fits: world size and every rank's tier. A resume keeps the
        decision while this is unchanged."""
        return self.world, tuple(self.tiers)

    def same_choice(self, other: AutoDecision) -> bool:
        return (self.codec, self.density, self.rank) == (other.codec, other.density, other.rank)

    def describe(self) -> str:
        what = Candidate(self.codec, self.density, self.rank).label
        return (f"compression=auto: {self.tier} link ({self.world} ranks, tiers {','.join(self.tiers)}) -> {what}, "
                f"{self.predicted_ms:.2f} ms/step of communication predicted "
                f"(link {self.measured.get('link_mbit_s', 0):.0f} Mbit/s, latency "
                f"{self.measured.get('latency_ms', 0):.2f} ms)")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict) -> AutoDecision:
        return cls(**{k: saved[k] for k in ("codec", "density", "rank", "tier", "tiers", "world", "predicted_ms")},
                   table=dict(saved.get("table", {})), measured=dict(saved.get("measured", {})))


def buckets_of(shapes: Sequence[Sequence[int]], cap_bytes: int = 25 << 20,
               first_cap_bytes: int = 1 << 20) -> list[list[tuple[int, ...]]]:
    """DDP's bucket layout, approximately: parameters in reverse order, a new bucket once one holds
    ``cap_bytes`` of fp32, the first once it holds ``first_cap_bytes``.

    NOTE: DDP closes its first bucket at 1 MB (``dist._DEFAULT_FIRST_BUCKET_BYTES``), so the
    gradients ready first go out early: a model over 1 MB has two buckets or more, which decides
    whether torch's PowerSGD hook can run on gloo (it aborts there with several).
    """
    out: list[list[tuple[int, ...]]] = [[]]
    size, cap = 0, first_cap_bytes
    for s in reversed([tuple(s) for s in shapes]):
        if size >= cap:
            out.append([])
            size, cap = 0, cap_bytes
        out[-1].append(s)
        size += 4 * math.prod(s)
    return out


def _slowest(values: list[float], group) -> list[float]:
    """Each figure's largest value over the ranks (collective)."""
    return [max(column) for column in zip(*all_gather_floats(values, group))]


def powersgd_seconds(shapes: Sequence[Sequence[int]], rank: int, device: torch.device, repeats: int = 2) -> float:
    """One step of torch's PowerSGD matrix work on these shapes: P = MQ, orthogonalise P,
    Q = M^T P, the approximation PQ^T and the error M - PQ^T (best of ``repeats``)."""
    gen = torch.Generator().manual_seed(0)
    mats = []
    for s in shapes:
        rows = s[0] if len(s) else 1
        cols = math.prod(s) // max(rows, 1)
        r = min(rank, rows, cols)
        if _should_compress(rows, cols, r, 2)[0]:
            mats.append((torch.randn(rows, cols, generator=gen).to(device), torch.randn(cols, r, generator=gen).to(device)))
    if not mats:
        return 0.0
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms allocations up
        t0 = time.perf_counter()
        for m, q in mats:
            p = torch.linalg.qr(m @ q).Q
            q2 = m.t() @ p
            _ = m - p @ q2.t()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure(process_group, shapes: Sequence[Sequence[int]], backend: str = "auto") -> AutoMeasurement:
    """The link and every candidate codec's work on this model (collective; the slowest rank's)."""
    device = device_for(process_group)
    numel = sum(math.prod(s) for s in shapes)
    densities = sorted({c.density for c in CANDIDATES if c.density is not None})
    ranks = sorted({c.rank for c in CANDIDATES if c.rank is not None})
    x = torch.randn(max(1, min(numel, 1 << 20)), device=device)
    cast = math.inf
    for _ in range(3):  # the first pass also pays allocation
        t0 = time.perf_counter()
        x.half().float()
        cast = min(cast, (time.perf_counter() - t0) / x.numel())
    local = [measure_codec_seconds_per_entry(device, backend, d) for d in densities]
    local += [powersgd_seconds(shapes, r, device) for r in ranks]
    agreed = _slowest([cast, *local], process_group)
    gbps = measure_bandwidth_gbps(process_group, min_seconds=0.02)  # agreed inside
    latency = allreduce_seconds(1, process_group, iters=5)
    n = x.numel()
    ratio = allreduce_seconds(n, process_group, 3, torch.float16) / max(allreduce_seconds(n, process_group, 3), 1e-9)
    return AutoMeasurement(link_bytes_per_s=gbps * 1e9 / 8, latency_s=latency, fp16_time_ratio=ratio,
                           topk_s_per_entry=dict(zip(densities, agreed[1:1 + len(densities)])),
                           cast_s_per_entry=agreed[0], powersgd_s=dict(zip(ranks, agreed[1 + len(densities):])),
                           backend=dist.get_backend(process_group))


def predict_seconds(c: Candidate, buckets: list[list[tuple[int, ...]]], world: int, m: AutoMeasurement) -> float:
    """Predicted seconds of communication and codec work per step for candidate ``c`` (the cost
    model's :func:`~hetero_strategy.cluster.cost.exchange_seconds` on the measured link)."""
    density, rank = c.density or 0.01, c.rank or 4
    numel = sum(math.prod(s) for b in buckets for s in b)
    link = Link.from_allreduce(m.link_bytes_per_s, world, m.latency_s)
    wire = exchange_seconds(c.codec, buckets, world, link, density, rank, half_time_ratio=m.fp16_time_ratio)
    work = {"dense": 0.0, "fp16": m.cast_s_per_entry * numel,
            "powersgd": m.powersgd_s.get(rank, 0.0),
            "topk_allreduce": m.topk_s_per_entry.get(density, 0.0) * numel}[c.codec]
    return wire + work


def choose(m: AutoMeasurement, buckets: list[list[tuple[int, ...]]], world: int, tiers: list[str],
           compute_s: float = 0.0, hierarchical: bool = False) -> AutoDecision:
    """The candidate with the least ``step_factor x (compute_s + predicted seconds)`` (pure: every
    rank computes the same from the same agreed measurement)."""
    table: dict[str, dict[str, float]] = {}
    scored: list[tuple[float, Candidate, float]] = []
    for c in CANDIDATES:
        if hierarchical and c.codec not in _TOPK_ONLY:
            table[c.label] = {"excluded": 1.0}  # the leaders' exchange runs Top-K codecs only
            continue
        if c.codec == "powersgd" and m.backend == "gloo" and len(buckets) > 1:
            # NOTE: torch's PowerSGD hook aborts on gloo with several buckets (hooks/baselines.py)
            table[c.label] = {"excluded": 1.0}
            continue
        t = predict_seconds(c, buckets, world, m)
        objective = STEP_FACTORS[c.label] * (compute_s + t)
        table[c.label] = {"predicted_ms": 1e3 * t, "step_factor": STEP_FACTORS[c.label], "objective_ms": 1e3 * objective}
        scored.append((objective, c, t))
    # NOTE: the least lossy candidate within TIE_MARGIN of the best: a prediction a few percent
    # ahead is within the measurement's noise, and on loopback fp16 predicted ahead of dense lost
    least = min(objective for objective, _, _ in scored)  # dense is never excluded
    _, c, t = next(s for s in scored if s[0] <= least * (1 + TIE_MARGIN))
    tier = max(tiers, key=TIERS.index) if tiers else "nvlink"
    return AutoDecision(codec=c.codec, density=c.density, rank=c.rank, tier=tier, tiers=list(tiers), world=world,
                        predicted_ms=1e3 * t, table=table,
                        measured={"link_mbit_s": m.link_bytes_per_s * 8 / 1e6, "latency_ms": 1e3 * m.latency_s,
                                  "compute_ms": 1e3 * compute_s})
