"""Fast groups for hierarchical compression: dense inside a node, compressed between nodes.

Each fast group (ranks joined by NVLink / one host) reduces densely; its lowest rank, the
*leader*, runs the compressed exchange with the other groups' leaders, then broadcasts the
result inside its group. Groups come from the config (``fast_groups``) or from the host
identity (host name + network namespace) of every rank.

Example::

    groups = build_fast_groups([[0, 1], [2, 3]])   # collective: every rank calls it
    groups.is_leader, groups.leaders               # (True on ranks 0 and 2), [0, 2]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.hooks import communicator as comm
from hetero_strategy.hooks.tiers import _host_identity

__all__ = ["FastGroups", "build_fast_groups", "hierarchical_exchange"]


@dataclass
class FastGroups:
    members: list[int]
    """Global ranks of this rank's fast group."""
    intra: Any
    """Process group of the fast group."""
    leaders: list[int]
    """Lowest global rank of every fast group, in group order."""
    cross: Any
    """Process group of the leaders (None on other ranks)."""
    groups: list[list[int]]
    """Every fast group's global ranks, in group order (the leaders' order)."""

    @property
    def leader(self) -> int:
        return self.members[0]

    @property
    def is_leader(self) -> bool:
        return dist.get_rank() == self.leader


def _groups_by_host() -> list[list[int]]:
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, _host_identity())
    order: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        order.setdefault(host, []).append(rank)
    return list(order.values())


def build_fast_groups(groups: list[list[int]] | None = None) -> FastGroups:
    """Create the intra-group and leader process groups (collective on the default group)."""
    world, me = dist.get_world_size(), dist.get_rank()
    groups = [sorted(g) for g in (groups or _groups_by_host())]
    if sorted(r for g in groups for r in g) != list(range(world)):
        raise ValueError(f"fast_groups={groups!r} is invalid: with {world} ranks the groups must cover "
                         f"ranks 0..{world - 1} exactly once")
    mine, intra = None, None
    for g in groups:  # NOTE: every rank must create every group, in the same order
        pg = dist.new_group(g)
        if me in g:
            mine, intra = g, pg
    leaders = [g[0] for g in groups]
    cross = dist.new_group(leaders)
    return FastGroups(members=mine, intra=intra, leaders=leaders, cross=cross if me in leaders else None,
                      groups=groups)


def hierarchical_exchange(state, bucket: dist.GradBucket, step: int, mode: str, compress) -> torch.futures.Future:
    """Dense sum inside the fast group, ``compress`` between leaders, broadcast back.

    ``state`` is a CompressedState whose bucket is already weighted; ``compress(state, bucket,
    step, mode)`` runs the leaders' exchange over ``state.exchange_group``.

    NOTE: the leader needs the group sum before compressing and the exchanged result before
    broadcasting, so it waits on both futures here (on NCCL a stream wait, not a host sync; on
    gloo this serialises the buckets' communication).
    """
    h, buf = state.hier, bucket.buffer()
    numel_bytes = buf.numel() * buf.element_size()
    fut, sent = comm.all_reduce(buf, h.intra)
    fut.wait()
    # the broadcast's bytes are counted now: the step's totals close inside compress
    state.add_wire_bytes(sent + numel_bytes)
    if h.is_leader:
        if state.all_dense():  # dense links between all leaders
            fut, sent = comm.all_reduce(buf, state.exchange_group)
            state.account(bucket, "dense", sent, buf.numel())
            fut.wait()
            result = buf
        else:
            result = compress(state, bucket, step, mode).wait()
    else:
        result = torch.empty_like(buf)
        state.account(bucket, mode, 0, buf.numel())
    work = dist.broadcast(result, src=h.leader, group=h.intra, async_op=True)
    return comm.then(work.get_future(), lambda: result)
