"""Link tiers: how hard each rank compresses, how often it exchanges, how strongly it compensates.

docs/design.md semantics 8. A rank's tier comes, in this order, from the configuration (``tier=``),
the ``HETERO_TIER`` environment variable, or a measurement: ranks that share a host *and* a
network namespace talk over shared memory/loopback and get ``nvlink`` (dense); otherwise a short
all-reduce probe measures the link and :func:`tier_from_bandwidth` maps it to a tier.

Example::

    policy = tier_policy("eth1g")                 # TierPolicy(tier_factor=1.0, exchange_every=1, gamma=1.0)
    policy = tier_policy("ib", {"ib": {"gamma": 0.8}})
    tier_from_bandwidth(0.1)                      # 'eth1g' (a 100 Mbit/s link)
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from hetero_strategy.cluster.tiers import classify_tier
from hetero_strategy.config import TIERS, counted
from hetero_strategy.dist import measure_bandwidth_gbps

__all__ = [
    "DEFAULT_TIERS",
    "TIER_ENV",
    "TierPolicy",
    "exchange_codec",
    "exchange_policies",
    "gather_tiers",
    "leader_tiers",
    "resolve_tier",
    "tier_from_bandwidth",
    "tier_policy",
]

TIER_ENV = "HETERO_TIER"


@dataclass(frozen=True)
class TierPolicy:
    """Compression policy of one link tier."""

    tier_factor: float | None
    """Multiplies base_density; None means the tier sends dense gradients."""
    exchange_every: int
    """Exchange every N steps; in between the rank sends nothing and keeps its gradient in the residual."""
    gamma: float
    """Error-feedback compensation strength (residual decay); ignored by dense tiers."""
    codec: str = "topk"
    """How the exchange goes when this is the slowest tier of it: topk, topk_allreduce, onebit,
    fp16, bf16, powersgd, or dense (the same as tier_factor None)."""
    rank: int = 4
    """PowerSGD's matrix approximation rank, for codec powersgd."""


# NOTE: not the older "field experience" table (ib 0.5/1/0.9, eth10g 0.3/2/0.95, eth1g
# 0.1/5/0.98), whose eth1g row ended 3.2 points below dense in an earlier benchmark. Measured end
# to end (bench compression, docs/compression.md), every tier sending base_density each step with
# classic error feedback stays within a point of dense; whether compressing pays at all is
# measured per link (dense_fallback). The old rows stay available as tier_overrides.
DEFAULT_TIERS: dict[str, TierPolicy] = {
    "nvlink": TierPolicy(tier_factor=None, exchange_every=1, gamma=1.0),
    "ib": TierPolicy(tier_factor=1.0, exchange_every=1, gamma=1.0),
    "eth10g": TierPolicy(tier_factor=1.0, exchange_every=1, gamma=1.0),
    "eth1g": TierPolicy(tier_factor=1.0, exchange_every=1, gamma=1.0),
}


def tier_policy(tier: str, overrides: dict[str, dict[str, Any]] | None = None) -> TierPolicy:
    """The policy of ``tier`` with the config's per-tier overrides applied (validated by the config)."""
    base = DEFAULT_TIERS[tier]
    extra = dict((overrides or {}).get(tier) or {})
    if extra.get("codec") == "dense":  # one meaning of dense: no residual, the plain all-reduce
        extra["tier_factor"] = None
    return dataclasses.replace(base, **extra)


def exchange_codec(method: str, tiers: list[str] | None, policies: list[TierPolicy]) -> tuple[str, TierPolicy]:
    """The codec every member of one exchange runs, and the policy it comes from.

    One exchange runs one codec on every rank (their collectives must match), and a ring moves
    at the pace of its slowest link: for ``tiered`` the slowest member tier's codec decides.
    Other methods are their own codec.
    """
    if method != "tiered" or not tiers:
        return method, policies[0]
    slowest = max(range(len(tiers)), key=lambda i: TIERS.index(tiers[i]))  # TIERS: fastest first
    policy = policies[slowest]
    return ("dense" if policy.tier_factor is None else policy.codec), policy


def tier_from_bandwidth(gbps: float) -> str:
    """Map a measured all-reduce bandwidth in Gbit/s to a tier name (the cluster profiler's table)."""
    return classify_tier(gbps)


def _host_identity() -> str:
    """Host name plus network namespace: ranks in separate namespaces (emulated links) differ."""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}|{netns}"


def resolve_tier(configured: str | None, process_group: dist.ProcessGroup | None = None) -> str:
    """This rank's tier: config, else ``HETERO_TIER``, else measured (collective when measuring).

    All ranks of the group must call this together: the measurement is collective, and whether it
    happens is agreed first, so a rank with a configured tier still joins the others' probe.
    """
    local = configured or os.environ.get(TIER_ENV) or None
    if local is not None and local not in DEFAULT_TIERS:
        raise ValueError(f"{TIER_ENV}={local!r} is invalid: choose one of {', '.join(DEFAULT_TIERS)}")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(process_group) == 1:
        return local or "nvlink"
    world = dist.get_world_size(process_group)
    infos: list[Any] = [None] * world
    dist.all_gather_object(infos, (local, _host_identity()), group=process_group)
    if all(tier is not None for tier, _ in infos):
        return local  # type: ignore[return-value]
    if len({host for _, host in infos}) == 1:
        measured = "nvlink"  # one host, one network namespace: shared memory / loopback
    else:
        measured = tier_from_bandwidth(measure_bandwidth_gbps(process_group))
    return local or measured


def gather_tiers(tier: str, process_group: dist.ProcessGroup | None = None) -> list[str]:
    """Every rank's tier (collective), so each rank can compute every rank's payload size."""
    if not (dist.is_available() and dist.is_initialized()):
        return [tier]
    out: list[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(out, tier, group=process_group)
    return list(out)


def leader_tiers(tiers: list[str], groups: list[list[int]]) -> list[str]:
    """The tier of each fast group's leader in the exchange between groups (hierarchical mode).

    Inside a group the reduction is dense whatever the tiers; between groups the link is the
    bottleneck, so a leader takes the slowest tier among its group's ranks. A group whose ranks are
    all on a dense tier (NVLink inside the node) reaches the other groups over the job's slowest
    link, so it takes that tier; only a job on dense tiers throughout exchanges densely.
    """
    def slowest(ts: list[str]) -> str:
        return max(ts, key=TIERS.index)  # TIERS runs from the fastest link to the slowest

    dense = TIERS[0]
    job = slowest(tiers)
    out = []
    for g in groups:
        own = slowest([tiers[r] for r in g])
        out.append(job if own == dense else own)
    return out


def exchange_policies(config: Any, group: dist.ProcessGroup | None,
                      fast_groups: list[list[int]] | None = None) -> tuple[list[str], list[TierPolicy]]:
    """Each exchange member's tier and policy for ``compression="tiered"`` (collective).

    Flat (``fast_groups`` None): the members are the ranks of ``group``. Hierarchical: the members
    are the fast groups' leaders, and :func:`leader_tiers` derives their tiers from every rank's.

    NOTE: in hierarchical mode tiers are resolved and gathered over the default group (every rank,
    leader or not): a leader's exchange tier depends on its whole group.
    """
    scope = None if fast_groups is not None else group
    world = dist.get_world_size(scope) if dist.is_initialized() else 1
    if config.tiers is not None and len(config.tiers) != world:
        raise ValueError(f"tiers={config.tiers!r} is invalid: {counted(len(config.tiers), 'entry', 'entries')} "
                         f"for {counted(world, 'rank')}; give one tier per rank")
    me = dist.get_rank(scope) if dist.is_initialized() else 0
    mine = config.tiers[me] if config.tiers else config.tier
    if mine is None and config.tier_profile is not None and not os.environ.get(TIER_ENV):
        mine = _profile_tier(config.tier_profile, me, world)
    tiers = gather_tiers(resolve_tier(mine, scope), scope)
    if fast_groups is not None:
        tiers = leader_tiers(tiers, fast_groups)
    return tiers, [tier_policy(t, config.tier_overrides) for t in tiers]


def _profile_tier(path: str, rank: int, world: int) -> str:
    """This rank's tier from a cluster profile JSON written by ``hetero-strategy profile``."""
    from hetero_strategy.cluster.profile import load_profile

    try:
        tiers = load_profile(path).tiers
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"tier_profile={path!r} is invalid: {e}; run `hetero-strategy profile` to write one") from e
    if len(tiers) != world:
        raise ValueError(f"tier_profile={path!r} is invalid: it profiles {counted(len(tiers), 'rank')} but the job has "
                         f"{world}; profile this cluster again")
    return tiers[rank]
