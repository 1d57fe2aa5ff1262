"""What an emulated cluster looks like: per-rank compute factor, nodes, link rate, queueing latency
and the links' MTU."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetero_strategy.cluster.tiers import classify_tier, parse_rate

__all__ = ["UNSHAPED", "ClusterSpec", "parse_float_list", "parse_link_list"]

UNSHAPED = ("none", "unlimited", "")


@dataclass(kw_only=True, slots=True)
class ClusterSpec:
    """Validated description of an emulated cluster.

    Example::

        spec = ClusterSpec(compute=[1.0, 0.57], links=["10gbit", "100mbit"])
        spec.rates_bps  # [1e10, 1e8]
        # node A runs 1 rank, node B 3 (one namespace and one link per node)
        spec = ClusterSpec(compute=[1.0, 0.5, 0.5, 0.5], nodes=[1, 3], links=["10gbit", "1gbit"])
        spec.node_of  # [0, 1, 1, 1]; spec.links is per rank: ["10gbit", "1gbit", "1gbit", "1gbit"]
    """

    compute: list[float]
    """Per-rank share of one CPU core (1.0 = a full core, 0.57 = 57% quota)."""
    links: list[str] | None = None
    """Per-rank link rate in tc spelling ("10gbit", "100mbit"), "none" for unshaped; one entry
    applies to every rank; None leaves every link unshaped."""
    latency_ms: list[float] | None = None
    """Per-rank tbf queueing-latency bound in ms (netem is unavailable, so this is not a fixed delay)."""
    simulate: bool = False
    """Run on loopback with an in-process compute slowdown instead of namespaces and cgroups."""
    nodes: list[int] | None = None
    """Ranks per node, e.g. [1, 3]: a node's ranks share one network namespace (they talk over
    loopback, as over NVLink) and one link, and get torchrun's per-node variables (GROUP_RANK,
    LOCAL_RANK, LOCAL_WORLD_SIZE). ``links`` and ``latency_ms`` then give one entry per node. None:
    every rank is its own namespace on one torchrun "node" (the default)."""
    mtu: int = 1500
    """Every veth's MTU in bytes, 576-9000. Each packet costs the receiving rank kernel work that
    its CPU quota pays for, where a real NIC would do it; at 9000 (jumbo frames, as datacenter
    links run) that cost is a sixth of 1500's, so codec work beside a transfer slows less."""
    memory: list[str] | None = None
    """Per-rank memory limit ("1.5G", "700M", "none"; one entry applies to every rank): a cgroup
    memory limit, over which the kernel kills the rank. None: no limit."""
    memory_bytes: list[int | None] = field(init=False, default_factory=list)
    rates_bps: list[float | None] = field(init=False, default_factory=list)
    node_of: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.compute, (list, tuple)) or not self.compute:
            raise ValueError(f"compute={self.compute!r} is invalid: give one factor per rank, e.g. 1.0,0.57")
        n = len(self.compute)
        self.node_of = self._nodes(n)
        for i, c in enumerate(self.compute):
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.01 <= c <= 1.0:
                raise ValueError(f"compute[{i}]={c!r} is invalid: a rank gets one pinned core, so its factor "
                                 "must lie in [0.01, 1.0] (1.0 = a full core)")
        # links and latencies: one per link owner (a rank, or a node with nodes=), then per rank
        owners = n if self.nodes is None else len(self.nodes)
        what = "rank" if self.nodes is None else "node"
        links = ["none"] * owners if self.links is None else list(self.links)
        if len(links) == 1:
            links = links * owners
        if len(links) != owners:
            raise ValueError(f"links={self.links!r} is invalid: give 1 or {owners} entries (one per {what})")
        self.links = [links[k] if self.nodes is None else links[self.node_of[k]] for k in range(n)]
        self.rates_bps = [None if str(x).strip().lower() in UNSHAPED else parse_rate(x) for x in self.links]
        lat = [50.0] if self.latency_ms is None else list(self.latency_ms)
        if len(lat) == 1:
            lat = lat * owners
        if len(lat) != owners or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in lat):
            raise ValueError(f"latency={self.latency_ms!r} is invalid: give 1 or {owners} positive values in ms")
        self.latency_ms = [float(lat[k] if self.nodes is None else lat[self.node_of[k]]) for k in range(n)]
        memory = ["none"] if self.memory is None else list(self.memory)
        memory = memory * n if len(memory) == 1 else memory
        if len(memory) != n:
            raise ValueError(f"memory={self.memory!r} is invalid: give 1 or {n} entries (one per rank), e.g. 1.5G,4G")
        self.memory_bytes = [parse_size(m, f"memory[{k}]") for k, m in enumerate(memory)]
        if self.simulate and any(b is not None for b in self.memory_bytes):
            raise ValueError(f"memory={self.memory!r} is invalid with simulate=True (--simulate): memory limits are "
                             "cgroups; run as root without --simulate")
        if isinstance(self.mtu, bool) or not isinstance(self.mtu, int) or not 576 <= self.mtu <= 9000:
            # NOTE: the upper bound keeps a packet inside tbf's smallest burst (32 KiB, netns.tbf_args)
            raise ValueError(f"mtu={self.mtu!r} is invalid: give whole bytes in [576, 9000], e.g. 1500 (Linux's "
                             "default) or 9000 (jumbo frames)")
        if self.simulate and self.mtu != 1500:
            raise ValueError(f"mtu={self.mtu} is invalid with simulate=True (--simulate): the simulated cluster runs "
                             "on loopback, with no links to set; drop mtu, or run as root without --simulate")

    def _nodes(self, n: int) -> list[int]:
        if self.nodes is None:
            return list(range(n))
        counts = list(self.nodes)
        if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts) or \
                sum(counts) != n:
            raise ValueError(f"nodes={self.nodes!r} is invalid: give each node's rank count (>= 1), summing to the "
                             f"{n} ranks of compute, e.g. nodes=[1, {max(1, n - 1)}]")
        return [node for node, c in enumerate(counts) for _ in range(c)]

    @property
    def node_firsts(self) -> list[int]:
        """The first rank of each namespace (each rank's own without nodes=)."""
        return [k for k in range(self.nproc) if k == 0 or self.node_of[k] != self.node_of[k - 1]]

    def job(self, ranks: Sequence[int] | None) -> list[int]:
        """The cluster ranks of a job (None: every rank), in torchrun's order: each node's together."""
        world = list(range(self.nproc)) if ranks is None else list(ranks)
        if not world or len(set(world)) != len(world) or not all(0 <= r < self.nproc for r in world):
            raise ValueError(f"ranks={world!r} is invalid: give distinct ranks of this {self.nproc}-rank cluster")
        nodes = [self.node_of[r] for r in world]
        if any(a != b and b in nodes[:i] for i, (a, b) in enumerate(itertools.pairwise(nodes), 1)):
            # torchrun numbers ranks node by node (RANK = the node's base + LOCAL_RANK)
            raise ValueError(f"ranks={world!r} is invalid: list each node's ranks together (nodes {nodes})")
        return world

    @property
    def nproc(self) -> int:
        return len(self.compute)

    def tier(self, rank: int) -> str | None:
        """The link tier a rank's configured rate falls in (None when unshaped)."""
        rate = self.rates_bps[rank]
        return None if rate is None else classify_tier(rate / 1e9)


def parse_float_list(text: str, name: str) -> list[float]:
    """"1.0,0.57" -> [1.0, 0.57]; the error names the option."""
    try:
        values = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = [math.nan]
    if not all(math.isfinite(v) for v in values):  # float() reads "nan" and "inf" too
        raise ValueError(f"{name}={text!r} is invalid: give comma-separated finite numbers, e.g. 1.0,0.57")
    return values


def parse_size(text: str, name: str) -> int | None:
    """"1.5G" / "700M" / "512K" / "2147483648" -> bytes; "none" -> None; the error names the option."""
    value = str(text).strip().upper().removesuffix("B")
    if value in ("NONE", ""):
        return None
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(value[-1:], 1)
    try:
        size = float(value[:-1] if scale > 1 else value) * scale
    except ValueError:
        size = 0.0
    if not (math.isfinite(size) and size >= 64 * 2**20):
        raise ValueError(f"{name}={text!r} is invalid: give a size of at least 64M, e.g. 1.5G or 700M (or none)")
    return int(size)


def parse_link_list(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in str(text).split(",")]
