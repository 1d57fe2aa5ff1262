"""How the ranks of ``compression="topk_allreduce"`` agree on one index set per parameter.

With one index set on every rank, the sparse sum is a single all-reduce of k values: bytes per rank
stay about 2k·4·(W-1)/W as the world grows, where an all-gather of every rank's own top-k
receives (W-1)·k pairs. The set comes from a leader that rotates over the ranks
(ScaleCom's cyclic local top-k, NeurIPS 2020): a parameter's leader in its round t is rank
t mod W. One change removes the wait:

* the leader of a parameter's round t+1 proposes its indices *during* round t, from its
  residual just after it was stored: the k largest |entries| not yet sent, which dominate its
  next accumulator g_{t+1} + gamma·residual_t. The proposal travels as an asynchronous
  broadcast issued beside round t's all-reduce, so round t+1 finds it already delivered and
  never blocks backward on it;
* a parameter with no proposal yet, or a proposal shorter than this call's k (the density rose),
  is *bootstrapped*: the leader takes the top-k of its current accumulator and broadcasts it, and
  every rank waits for it. Every rank decides alike (the proposals are the same on every rank),
  so the collectives stay in step.

Proposals are sorted by magnitude, so a smaller k later takes their prefix. Error feedback is
unchanged: what a rank does not send at the agreed indices stays in its residual.

Example::

    agreement = IndexAgreement(group)
    idx = agreement.agree(keys, plan.sparse, plan.caps, acc_of)   # per segment: (k,) int64 or None
    ...                                                          # send acc at idx, store residuals
    agreement.propose(keys, plan.sparse, plan.caps, residual_of)  # the next round's, on the wire
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.dist import device_for

__all__ = ["IndexAgreement"]


class IndexAgreement:
    """The agreed indices of each parameter (by its residual key) and the proposals on the wire.

    Each parameter counts its own rounds, and its leader is its round count mod W: DDP's bucket
    layout (which changes after step 1 and again on a resume) cannot shift the rotation.

    Args:
        process_group: the ranks that exchange (None: the default group).
    """

    __slots__ = ("process_group", "rounds", "agreed", "_pending", "last_bytes_sent")

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group
        self.rounds: dict[int, int] = {}  # key -> proposals so far; its leader is that mod W
        self.agreed: dict[int, torch.Tensor] = {}  # key -> (K,) int64, by the leader's |value|, descending
        self._pending: list[_Sent] = []  # proposals on the wire
        self.last_bytes_sent = 0  # index broadcasts of the last call, as a ring moves them

    # ---- the two halves of a call ------------------------------------------------------------
    def agree(self, keys: tuple[int, ...], sparse: list[bool], caps: list[int],
              acc_of: Callable[[int], torch.Tensor]) -> list[torch.Tensor | None]:
        """Per segment, the (caps[j],) segment-relative indices every rank sends (None: dense).

        ``acc_of(j)`` gives segment j's accumulator; it is read only by the leader, and only for
        a bootstrap. Collective when a bootstrap is needed (the same decision on every rank)."""
        self.collect()
        self.last_bytes_sent = 0
        need = [j for j, s in enumerate(sparse) if s and self.agreed.get(keys[j], _EMPTY).numel() < caps[j]]
        for sent in self._broadcasts(keys, need, caps, acc_of):
            for key, idx in sent.wait_all():
                self.agreed[key] = idx
        return [self.agreed[keys[j]][:caps[j]] if s else None for j, s in enumerate(sparse)]

    def propose(self, keys: tuple[int, ...], sparse: list[bool], caps: list[int],
                residual_of: Callable[[int], torch.Tensor]) -> None:
        """Start the broadcasts of the next leaders' indices: each one's top-caps of its residual."""
        chosen = [j for j, s in enumerate(sparse) if s]
        for j in chosen:
            self.rounds[keys[j]] = self.rounds.get(keys[j], 0) + 1
        self._pending.extend(self._broadcasts(keys, chosen, caps, residual_of))

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self.collect()
        return {"rounds": dict(self.rounds), "agreed": {k: v.cpu().clone() for k, v in self.agreed.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending.clear()
        self.rounds = {int(k): int(v) for k, v in state.get("rounds", {}).items()}
        self.agreed = {int(k): v.to(self._device(), torch.int64) for k, v in state.get("agreed", {}).items()}

    # ---- helpers -------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return device_for(self.process_group) if dist.is_initialized() else torch.device("cpu")

    def collect(self) -> None:
        """Take in the proposals of earlier calls (delivered by now, in the normal case)."""
        for sent in self._pending:
            for key, idx in sent.wait_all():
                self.agreed[key] = idx
        self._pending.clear()

    def _broadcasts(self, keys: tuple[int, ...], chosen: list[int], caps: list[int],
                    values_of: Callable[[int], torch.Tensor]) -> list[_Sent]:
        """One async broadcast per leader among ``chosen`` segments, of its int32 picks (the
        top-caps of ``values_of(j)``); in leader order, the same on every rank."""
        world = dist.get_world_size(self.process_group) if dist.is_initialized() else 1
        me = dist.get_rank(self.process_group) if dist.is_initialized() else 0
        by_leader: dict[int, list[int]] = {}
        for j in chosen:
            by_leader.setdefault(self.rounds.get(keys[j], 0) % world, []).append(j)
        out = []
        for leader in sorted(by_leader):
            js = by_leader[leader]
            counts = [caps[j] for j in js]
            if leader == me:
                buf = torch.cat([_top(values_of(j), caps[j]).to(torch.int32) for j in js])
            else:
                buf = torch.empty(sum(counts), dtype=torch.int32, device=self._device())
            work = None
            if world > 1:
                src = leader if self.process_group is None else dist.get_global_rank(self.process_group, leader)
                work = dist.broadcast(buf, src=src, group=self.process_group, async_op=True)
                self.last_bytes_sent += buf.numel() * 4 * (world - 1) // world  # a pipelined ring's share
            out.append(_Sent(work, buf, [keys[j] for j in js], counts))
        return out


class _Sent:
    """One leader's broadcast: its work handle, the buffer, and which keys hold how many indices."""

    __slots__ = ("buf", "counts", "keys", "work")

    def __init__(self, work: Any, buf: torch.Tensor, keys: list[int], counts: list[int]) -> None:
        self.work, self.buf, self.keys, self.counts = work, buf, keys, counts

    def wait_all(self) -> list[tuple[int, torch.Tensor]]:
        if self.work is not None:
            self.work.wait()
        return [(key, idx.to(torch.int64)) for key, idx in zip(self.keys, self.buf.split(self.counts))]


_EMPTY = torch.empty(0, dtype=torch.int64)


def _top(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest |x|, sorted descending, so a later, smaller k takes a prefix.

    NOTE: torch.topk, not the selection kernels: those do not order what they select, and only
    the leader runs this, once per call."""
    return torch.topk(x.abs(), min(k, x.numel()), sorted=True).indices
