"""A cluster to plan for: nodes, their devices and links, from a cluster YAML and/or profiles.

The YAML (docs/planner.md)::

    efficiency: 0.4        # share of peak TFLOP/s a training step reaches (optional; 0.4)
    overlap: 0.5           # share of compute the exchange can hide under (optional; 0.5)
    backend: nccl          # nccl (ring or hierarchical all-reduce) or gloo (ring only)
    nodes:
      - name: a
        devices: [A100-80GB, A100-80GB, V100-32GB]   # names from cluster/cards.yaml
        intra: nvlink                                # a link kind of cards.yaml, or a rate: 600gbit
        inter: eth25g
      - devices: {RTX3090: 4}                        # card: how many
        count: 2                                     # this node twice
        inter: 10gbit
        profile: node-b.json                         # measured figures override the table's

A profile written by ``hetero-strategy profile`` may also stand alone, as one node: its ranks'
measured matmul TFLOP/s (in their training dtype), memory bandwidth and link.

Example::

    cluster = read_cluster(["cluster.yaml"])
    cluster.world, cluster.topology.ring_link()
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hetero_strategy.cluster.cards import load_cards
from hetero_strategy.cluster.cost import Link, Topology
from hetero_strategy.cluster.profile_link import measured_link, wire_share
from hetero_strategy.cluster.tiers import classify_tier, parse_rate
from hetero_strategy.cluster.wire import ring_traffic
from hetero_strategy.config.errors import ConfigError, _number, _whole, shown

__all__ = ["PlanCluster", "RankDevice", "read_cluster"]

_KEYS = {"efficiency", "overlap", "backend", "nodes"}
_NODE_KEYS = {"name", "devices", "count", "intra", "inter", "profile", "fixed_ms"}


@dataclass(frozen=True)
class RankDevice:
    """One rank as the cost model sees it."""

    node: str
    card: str
    dtype: str
    tflops: float
    """Peak dense TFLOP/s in ``dtype`` (the table's), or the matmul rate a profile measured."""
    memory_gbps: float
    fp32_tflops: float
    """fp32 TFLOP/s (PowerSGD's matrix work runs in fp32)."""
    fixed_s: float = 0.0
    measured: bool = False
    model_step: tuple[str, float, float] | None = None
    """(model, samples/s, fixed seconds) of that model's step as a profile timed it (``profile --model``;
    the fixed part with the optimizer's step)."""
    codec_s: tuple[tuple[str, float], ...] = ()
    """(candidate label, seconds) of each codec's work on that model as ``compression="auto"``
    measures it (its stand-ins: what it decides from)."""
    hook_s: tuple[tuple[str, float], ...] = ()
    """(candidate label, seconds) of each codec's hook under DDP on that model (what a step pays)."""
    memory_bytes: float | None = None
    """The device's memory (the table's, or what a profile read), None where unknown."""
    cpu_share: float | None = None
    """A CPU rank's share of a core, as its profile's timed windows got it (``model_step.cpu_share``:
    under a quota, 0.57 of a core reads ~0.57); None for an accelerator or where not measured."""
    exchange_cpu_s: float | None = None
    """A CPU rank's CPU seconds per step of DDP's dense exchange, as profiled (the DDP step less the
    bare one), over its ring's traffic factor 2(W-1)/W there: per unit of it; None where not measured."""


@dataclass(frozen=True)
class PlanCluster:
    ranks: tuple[RankDevice, ...]
    topology: Topology
    tiers: tuple[str, ...]
    """Each rank's link tier (semantics 8): of its inter-node link, or of its node's on one node."""
    efficiency: float = 0.4
    overlap: float = 0.5
    backend: str = "nccl"
    wire_share: float | None = None
    """The share of a measured all-reduce's time its link takes (its bus bandwidth over the
    point-to-point one; the rest is the reduction's work); None where no profile measured both."""

    @property
    def world(self) -> int:
        return len(self.ranks)

    def replicated(self, times: int) -> PlanCluster:
        """The same mix ``times`` over: every node repeated (for ``plan --scale``)."""
        t = self.topology
        return replace(self, ranks=self.ranks * times, tiers=self.tiers * times,
                                   topology=Topology(t.per_node * times, t.intra * times, t.inter * times,
                                                     t.hierarchical))


@dataclass
class _Node:
    """One node entry of the cluster file, checked in ``__post_init__`` (``where``: its path, e.g. nodes[1])."""

    where: str
    entry: Any
    base: Path
    devices: list[RankDevice] = field(init=False)
    intra: Link = field(init=False)
    inter: Link = field(init=False)
    count: int = field(init=False)

    def __post_init__(self) -> None:
        e = self.entry
        if not isinstance(e, dict):
            _refuse(self.where, e, "give a mapping with devices: and/or profile:, intra:, inter:")
        for k in e:
            if k not in _NODE_KEYS:
                _refuse(f"{self.where}.{k}", e[k], f"unknown key; use {', '.join(sorted(_NODE_KEYS))}")
        name = str(e.get("name", self.where))
        self.count = e.get("count", 1)
        if not _whole(self.count) or not 1 <= self.count <= 4096:
            _refuse(f"{self.where}.count", self.count, "give how many such nodes, a whole number in [1, 4096]")
        fixed = e.get("fixed_ms", 0.0)
        if not _number(fixed) or fixed < 0:
            _refuse(f"{self.where}.fixed_ms", fixed, "give a step's fixed cost in ms, a number >= 0")
        self.doc = self._measured(e.get("profile"))
        measured = None if self.doc is None else self.doc["ranks"]
        self.devices = self._devices(e.get("devices"), measured, name, fixed / 1e3)
        self.intra = self._link("intra", e.get("intra", "nvlink" if measured is None else None), measured)
        self.inter = self._link("inter", e.get("inter", "eth10g" if measured is None else None), measured)

    def _measured(self, profile: Any) -> dict | None:
        if profile is None:
            return None
        from hetero_strategy.cluster.profile import read_profile

        if not isinstance(profile, str) or not profile:
            _refuse(f"{self.where}.profile", profile, "give the path of a `hetero-strategy profile` JSON")
        return read_profile(self.base / profile, whole=True)

    def _devices(self, devices: Any, measured: list[dict] | None, node: str, fixed_s: float) -> list[RankDevice]:
        cards = load_cards().cards
        if isinstance(devices, dict):
            if not all(_whole(n) and n >= 1 for n in devices.values()):
                _refuse(f"{self.where}.devices", devices, "give card: count pairs, each count a whole number >= 1")
            devices = [c for c, n in devices.items() for _ in range(n)]
        if devices is None and measured is not None:
            devices = [None] * len(measured)
        if not isinstance(devices, list) or not devices or len(devices) > 65536:
            _refuse(f"{self.where}.devices", devices, "give a list of card names, or {card: count}, or a profile:")
        if measured is not None and len(measured) != len(devices):
            _refuse(f"{self.where}.devices", devices, f"the profile measured {len(measured)} rank(s): give as many")
        out = []
        for i, name in enumerate(devices):
            m = measured[i] if measured is not None else None
            if name is not None and name not in cards:
                _refuse(f"{self.where}.devices[{i}]", name, f"unknown card; choose one of {', '.join(cards)}, "
                        "or give a profile: measured on it")
            out.append(_rank(cards.get(name), m, node, fixed_s, len(devices)))
        return out

    def _link(self, key: str, value: Any, measured: list[dict] | None) -> Link:
        links = load_cards().links
        if value is None and self.doc is not None:
            return measured_link(self.doc)
        if isinstance(value, str) and value in links:
            return links[value]
        try:  # NOTE: a bare rate gets a typical Ethernet latency; name a link kind for another
            return Link(parse_rate(str(value)) / 8, 20e-6)
        except ValueError:
            _refuse(f"{self.where}.{key}", value, f"choose a link kind ({', '.join(links)}) or a rate such as 25gbit")
        raise AssertionError  # unreachable: _refuse raises


def _refuse(where: str, value: Any, fix: str) -> None:
    raise ConfigError(f"{where}={shown(value)} is invalid: {fix}")


def _rank(card: Any, measured: dict | None, node: str, fixed_s: float, world: int) -> RankDevice:
    """A rank from the table's card and/or a profile's rank entry (measured figures win) of a
    profile of ``world`` ranks."""
    if measured is None:
        return RankDevice(node, card.name, card.dtype, card.peak_tflops(), card.memory_gbps, card.tflops["fp32"],
                          fixed_s, memory_bytes=card.memory_gb * 2**30)
    dtype = measured.get("training_dtype") or (card.dtype if card else "fp32")
    rates = measured.get("matmul_tflops") or {}
    tflops = rates.get(dtype) or rates.get("fp32") or (card.peak_tflops() if card else None)
    mem = measured.get("memory_gbps") or (card.memory_gbps if card else None)
    if not _number(tflops) or tflops <= 0 or not _number(mem) or mem <= 0:
        _refuse(f"profile rank {measured.get('rank')}", {"matmul_tflops": rates, "memory_gbps": mem},
                "re-run `hetero-strategy profile`: it measures both")
    name = card.name if card else str((measured.get("device") or {}).get("name", "measured"))
    fp32 = rates.get("fp32") or (card.tflops["fp32"] if card else tflops)
    step = measured.get("model_step")
    timed = None
    if isinstance(step, dict) and _number(step.get("samples_per_s")) and step["samples_per_s"] > 0 \
            and _number(step.get("fixed_s")) and isinstance(step.get("model"), str):
        optimizer = step.get("optimizer_s") if _number(step.get("optimizer_s")) else 0.0
        timed = (step["model"], float(step["samples_per_s"]), max(0.0, float(step["fixed_s"])) + max(0.0, optimizer))
    held, on_cpu = (measured.get("device") or {}).get("memory_bytes"), (measured.get("device") or {}).get("kind") == "cpu"
    held = float(held) if _number(held) and held > 0 else (card.memory_gb * 2**30 if card else None)
    share, exchange = (step.get("cpu_share"), step.get("exchange_cpu_s")) if on_cpu and timed else (None, None)
    share = float(share) if _number(share) and share > 0 else None
    return RankDevice(node, name, dtype, float(tflops), float(mem), float(fp32), fixed_s, True, timed,
                      _seconds(step, "codec_s", timed), _seconds(step, "hook_s", timed), held, share,
                      float(exchange) / ring_traffic("all_reduce", max(world, 2))[0]
                      if share and _number(exchange) and exchange >= 0 else None)


def _seconds(step: Any, key: str, timed: Any) -> tuple[tuple[str, float], ...]:
    """A profile's {label: seconds} table under ``model_step[key]`` (empty where absent)."""
    table = step.get(key) if timed is not None else None
    return tuple((k, float(v)) for k, v in table.items() if _number(v) and v >= 0) if isinstance(table, dict) else ()


def read_cluster(paths: list[str]) -> PlanCluster:
    """The cluster of one YAML file and/or profile JSON files (each profile one node).

    Raises:
        ConfigError: naming the field (``nodes[1].devices[0]``), its value and the fix.
    """
    settings: dict[str, Any] = {}
    entries: list[tuple[str, Any, Path]] = []
    for p in paths:
        path = Path(p)
        if path.suffix.lower() == ".json":
            entries.append((f"{path.name}", {"profile": path.name, "name": path.stem}, path.parent))
            continue
        from hetero_strategy.config.files import read_yaml

        data = read_yaml(path, "cluster")
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
            _refuse("nodes", data.get("nodes") if isinstance(data, dict) else data,
                    "give a list of nodes, each with devices: (card names) and intra:/inter: links")
        for k in data:
            if k not in _KEYS:
                _refuse(k, data[k], f"unknown key; use {', '.join(sorted(_KEYS))}")
        settings.update({k: v for k, v in data.items() if k != "nodes"})
        entries += [(f"nodes[{i}]", e, path.parent) for i, e in enumerate(data["nodes"])]
    if not entries:
        _refuse("cluster", paths, "give a cluster YAML or profile JSON files")
    return _assemble([_Node(w, e, b) for w, e, b in entries], settings)


def _assemble(nodes: list[_Node], settings: dict[str, Any]) -> PlanCluster:
    docs = [n.doc for n in nodes if n.doc is not None]
    shares = [s for s in (wire_share(d) for d in docs) if s is not None]
    wire = min(shares) if shares else None
    # NOTE: CPUs too, for the link's part; the host's part is on each CPU rank's core (plan_ranks.on_core)
    eff = settings.get("efficiency", 0.4)
    overlap = settings.get("overlap", 0.5)
    backend = settings.get("backend", "gloo" if any(d.get("backend") == "gloo" for d in docs) else "nccl")
    if not _number(eff) or not 0 < eff <= 1:
        _refuse("efficiency", eff, "give the share of peak TFLOP/s a step reaches, in (0, 1], e.g. 0.4")
    if not _number(overlap) or not 0 <= overlap <= 1:
        _refuse("overlap", overlap, "give the share of compute the exchange hides under, in [0, 1]")
    if backend not in ("nccl", "gloo"):
        _refuse("backend", backend, "choose nccl or gloo")
    ranks, tiers, per_node, intra, inter = [], [], [], [], []
    for n in nodes:
        for _ in range(n.count):
            ranks += n.devices
            outward = n.inter if len(nodes) > 1 or n.count > 1 else n.intra  # the link its exchange crosses
            tiers += [classify_tier(outward.bytes_per_s * 8 / 1e9)] * len(n.devices)
            per_node.append(len(n.devices))
            intra.append(n.intra)
            inter.append(n.inter)
    if len(ranks) > 1 << 20:
        _refuse("nodes", f"{len(ranks)} ranks", "plan at most 2**20 ranks")
    topo = Topology(tuple(per_node), tuple(intra), tuple(inter), hierarchical=backend == "nccl")
    return PlanCluster(tuple(ranks), topo, tuple(tiers), float(eff), float(overlap), backend, wire)
