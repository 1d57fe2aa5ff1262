"""The one Top-K exchange with error feedback: the DDP hooks' and the hybrid mode's alike.

:func:`topk_ef_exchange` sums a flat fp32 tensor over the ranks while each rank sends only the
largest entries of its tensor plus its residual and keeps the rest for the next call:
sent_t + residual_t = x_t + gamma * residual_{t-1} (docs/compression.md, "Error feedback"). Its
:class:`TopKState` holds the residuals by bucket index, as PowerSGD's state holds its error dict.

* :func:`~hetero_strategy.hooks.compressed_hooks.topk_hook` weights each DDP bucket, plans k per
  parameter (:meth:`~hetero_strategy.hooks.compressed.CompressedState.plan`) and calls it;
* the hybrid mode's :class:`~hetero_strategy.hybrid.exchange.DeltaExchange` calls it once a
  period on the weighted model delta, one bucket of one segment.

With a :class:`~.threshold_select.ThresholdSelector` (``selection="threshold"``) each rank sends
every entry above a threshold reused between exact re-estimates instead of its exact top-k; the
count it actually sent is measured (``last_entries_measured``).

With ``shared_indices`` (``compression="topk_allreduce"``) every rank sends its accumulator at
one index set per segment that all ranks agreed on (:mod:`.shared_indices`), and the sparse
values travel in the chunk's one all-reduce instead of an all-gather; the rest is unchanged.

A NaN/inf anywhere in a rank's accumulator is never written into its residual (it keeps its last
finite value), and it surfaces: the result is all-NaN on every rank, so every rank drops it alike
(docs/reliability.md, "Non-finite gradients"). Detection is a 0-d marker riding in the payload:
no host sync.
"""

# NOTE: no `from __future__ import annotations`, like the hook modules (DDP inspects annotations).
from typing import NamedTuple

import torch
import torch.distributed as dist

from hetero_strategy.hooks.codecs import TopKCodec, ef_accumulate_
from hetero_strategy.hooks.exchange import Chunk, chunk_bounds, finish_exchange, issue_chunk, nonfinite_marker
from hetero_strategy.hooks.memory import ResidualMemory
from hetero_strategy.hooks.momentum import MomentumCorrection
from hetero_strategy.hooks.shared_indices import IndexAgreement
from hetero_strategy.hooks.threshold_select import ThresholdSelector, selector_for

__all__ = ["TopKPlan", "TopKState", "encode_chunks", "store_residuals", "topk_ef_exchange"]


class TopKPlan(NamedTuple):
    """How each segment (parameter) of a flat tensor is sent; the same on every rank but ``ks``."""

    sparse: "list[bool]"
    """Top-K of the segment (True), or the whole segment in the dense all-reduce."""
    ks: "list[int]"
    """Entries this rank sends (0: it skips this exchange and keeps everything in its residual)."""
    caps: "list[int]"
    """Payload slots: the largest k over ranks, so every rank's payload has one size."""
    whole: "list[bool]"
    """Sent whole because compressing it would not pay (``dense_fallback``; for the stats only)."""

    @classmethod
    def dense(cls, sizes: "list[int]") -> "TopKPlan":
        """Every segment whole: a dense all-reduce of acc that flushes the residual."""
        return cls([False] * len(sizes), list(sizes), list(sizes), [False] * len(sizes))


class TopKState:
    """State of :func:`topk_ef_exchange`: the group, the kernel backend and the residuals.

    Args:
        process_group: the group to sum over (None: the default group).
        backend: the kernels' backend (``compression_backend``: auto, triton or torch).
        memory: where residuals live, by bucket index (default: a new :class:`ResidualMemory`;
            the DDP hooks pass theirs, which the 1-bit hook shares).
        shared_indices: every rank sends its values at one agreed index set per segment, summed by
            one all-reduce (``topk_allreduce``, :mod:`~hetero_strategy.hooks.shared_indices`),
            instead of gathering each rank's own top-k.
        selector: pick the entries above reused thresholds instead of the exact top-k
            (``selection="threshold"``, :mod:`.threshold_select`); None: exact.
        momentum: DGC's momentum correction (:mod:`.momentum`): the exchange sends and keeps
            velocity, not the gradient (None: plain error feedback).
    """

    __slots__ = (
        # hyper-parameters
        "process_group", "backend",
        # internal state
        "memory", "agreement", "selector", "momentum",
        # stats (of the last call)
        "last_bytes_sent", "last_entries_sent", "last_entries_measured",
    )  # fmt: skip

    def __init__(self, process_group: "dist.ProcessGroup | None" = None, backend: str = "auto",
                 memory: "ResidualMemory | None" = None, shared_indices: bool = False,
                 selector: "ThresholdSelector | None" = None, momentum: "MomentumCorrection | None" = None) -> None:
        self.process_group, self.backend, self.momentum = process_group, backend, momentum
        self.memory = ResidualMemory() if memory is None else memory
        self.agreement = IndexAgreement(process_group) if shared_indices else None
        self.selector = selector
        self.last_bytes_sent = 0  # as the ring collectives move them (hooks/communicator.py)
        self.last_entries_sent = 0  # entries this rank planned to send: sparse k's and dense segments
        # what it actually sent: the same int under exact selection; under threshold selection a
        # 0-d device count, read only by the metrics (no host sync in a hook)
        self.last_entries_measured: int | torch.Tensor = 0

    @classmethod
    def for_config(cls, config, process_group: "dist.ProcessGroup | None", memory: ResidualMemory,
                   shared_indices: bool) -> "TopKState":
        """The exchange a :class:`CompressionConfig` asks for: its backend, selection and momentum."""
        return cls(process_group, config.compression_backend, memory, shared_indices, selector_for(config),
                   MomentumCorrection.of(config.momentum_correction, config.momentum_masking))

    def capacity(self, k: int, n: int) -> int:
        """Payload slots of a segment of ``n`` entries whose largest planned k over ranks is ``k``:
        k, or more under threshold selection (room for a threshold that lets more through)."""
        return k if self.selector is None else self.selector.capacity(k, n)

    def state_dict(self) -> dict:
        """What the exchange keeps beside the residuals: agreed index sets, thresholds, velocities."""
        out = {} if self.agreement is None else {"shared_indices": self.agreement.state_dict()}
        if self.selector is not None:
            out["thresholds"] = self.selector.state_dict()
        if self.momentum is not None:
            out.update(self.momentum.state_dict())
        return out

    def load_state_dict(self, state: dict) -> None:
        if self.agreement is not None:
            self.agreement.load_state_dict(state.get("shared_indices", {}))
        if self.selector is not None:
            self.selector.load_state_dict(state.get("thresholds", {}))
        if self.momentum is not None:  # a checkpoint without velocities starts them at zero
            self.momentum.load_state_dict(state)


def topk_ef_exchange(state: TopKState, index: int, keys: "tuple[int, ...]", flat: torch.Tensor,
                     sizes: "list[int]", plan: TopKPlan, gamma: float = 1.0,
                     stages: int = 1) -> torch.futures.Future[torch.Tensor]:
    """Sum over ranks of ``flat`` (n,) as Top-K with error feedback (collective; ``flat`` is used up).

    1. acc = flat + gamma * residual[index] (fp32, in ``flat`` when it is fp32), chunk after chunk
       of whole segments (at most ``stages``), each with a non-finite marker (0 or NaN, on device);
       with ``state.momentum``, flat is first replaced by this rank's velocity u = m * u + flat;
    2. per sparse segment its ``ks`` largest |acc| in ``caps`` slots; dense segments whole
       (k = 0: zeros, the segment stays in the residual);
    3. per chunk, issued at once: one all-gather of values + int32 indices (+ the marker), one
       all-reduce of the dense segments (+ the marker when nothing is gathered);
    4. residual[index] = acc minus what was sent (and u masked at the sent sparse entries), unless
       this rank's acc is non-finite: then residual and u keep their last finite values;
    5. the future's value: dense sums + every rank's sparse entries, in ``flat`` (its dtype); all
       NaN on every rank when any rank's acc was non-finite.

    ``keys`` name the segments' residuals across calls (:meth:`ResidualMemory.keys` of a DDP
    bucket, whose layout may change); ``state.last_bytes_sent`` and ``last_entries_sent`` hold the
    call's figures once it returns.

    Example::

        state = TopKState()
        k = max(1, int(0.01 * delta.numel()))
        plan = TopKPlan([True], [k], [k], [False])
        total = topk_ef_exchange(state, 0, (0,), delta, [delta.numel()], plan).wait()
    """
    residual = state.memory.residual(index, keys, list(flat.split(sizes)))  # (n,) fp32
    buf, velocity = flat, None
    if state.momentum is not None:  # DGC: the residual accumulates velocity, not the gradient
        velocity = state.momentum.advance(index, keys, flat, sizes)  # (u_{t-1}, u_t), (n,) fp32 each
        buf = velocity[1].clone()  # acc is built here (fp32: in place); u_t waits for the store
    segment = _segments(sizes)
    shared = None
    if state.agreement is not None:  # topk_allreduce: the index set every rank sends at
        shared = state.agreement.agree(keys, plan.sparse, plan.caps,
                                       lambda j: buf[segment(j)].float() + gamma * residual[segment(j)])
    pending, kept = [], []
    # NOTE: each chunk's collectives start as soon as it is encoded, so the next chunk's codec work
    # overlaps them (one chunk unless stages asks for more)
    for chunk, res, acc in encode_chunks(state, buf, residual, sizes, plan, gamma, stages, shared, keys):
        pending.append(issue_chunk(state.process_group, chunk))
        kept.append((chunk.marker, res, acc))
    if velocity is not None:  # buf now holds what stays in the residual
        state.momentum.mask_(velocity[1], buf, sizes, plan.sparse, plan.ks)
        kept.append((kept[0][0], *velocity))  # stored, or kept on a NaN step, with the residual
    store_residuals(kept)
    state.last_bytes_sent = sum(p.nbytes for p in pending)
    if state.agreement is not None:  # the next call's indices, on the wire beside this call's sums
        state.agreement.propose(keys, plan.sparse, plan.caps, lambda j: residual[segment(j)])
        state.last_bytes_sent += state.agreement.last_bytes_sent
    state.last_entries_sent = sum(p.chunk.sent_entries for p in pending)
    state.last_entries_measured = sum(p.chunk.sent_entries if p.chunk.measured is None else p.chunk.measured
                                      for p in pending)
    return finish_exchange(flat, pending, state.backend)


def encode_chunks(state: TopKState, buf: torch.Tensor, residual: torch.Tensor, sizes: "list[int]",
                  plan: TopKPlan, gamma: float, stages: int, shared: "list[torch.Tensor | None] | None" = None,
                  keys: "tuple[int, ...] | None" = None):
    """Encode ``buf`` chunk after chunk (:func:`chunk_bounds`); yields (chunk, its slice of the
    residual, its accumulator), so a caller can send each chunk before the next is encoded.
    ``shared``: per segment, the agreed indices to send at (``topk_allreduce``); ``keys``: the
    segments' residual ordinals (needed by ``state.selector``, which keeps thresholds by them)."""
    if state.selector is not None and keys is None:
        raise ValueError("keys: threshold selection keeps a threshold per parameter; pass the residual keys")
    offsets = _offsets(sizes)
    for lo, hi in chunk_bounds(sizes, stages):
        start, end = offsets[lo], offsets[hi - 1] + sizes[hi - 1]
        part = TopKPlan(*(field[lo:hi] for field in plan))
        chunk, acc = _encode(state.backend, buf[start:end], residual[start:end], start, sizes[lo:hi], part, gamma,
                             None if shared is None else shared[lo:hi],
                             None if state.selector is None else (state.selector, keys[lo:hi]))
        yield chunk, residual[start:end], acc


def store_residuals(kept: "list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]") -> None:
    """Each chunk's accumulator becomes its residual, from (marker, residual slice, acc) per chunk
    (and the velocity its new value, from (marker, u_{t-1}, u_t), with momentum correction).

    Never store a non-finite step: a NaN anywhere in this rank's tensor keeps all of its old
    residual (as one chunk would), so the chunking cannot change what a dropped step leaves behind.
    """
    bad = torch.isnan(torch.stack([marker for marker, _, _ in kept]).sum())
    if kept[0][1].device.type == "cpu":  # the check is free here, and a copy is half a where's passes
        if not bad:
            for _, res, acc in kept:
                res.copy_(acc)
        return
    for _, res, acc in kept:  # no host sync on an accelerator
        torch.where(bad, res, acc, out=res)


def _encode(backend: str, buf: torch.Tensor, residual: torch.Tensor, start: int, sizes: "list[int]",
            plan: TopKPlan, gamma: float, shared: "list[torch.Tensor | None] | None" = None,
            selector: "tuple[ThresholdSelector, tuple[int, ...]] | None" = None) -> "tuple[Chunk, torch.Tensor]":
    """Error feedback and selection of one chunk of whole segments; (the chunk, acc with its sent
    entries zeroed: the chunk's new residual once the tensor is known to be finite).
    ``selector``: threshold selection and the chunk's residual keys (None: the exact top-k)."""
    acc = ef_accumulate_(buf, residual, gamma, backend)  # (m,) fp32, in buf when it is fp32
    marker = nonfinite_marker(acc)
    # acc becomes what stays in the residual: sent entries are zeroed in place below
    offsets = _offsets(sizes)
    sparse, ks, caps = plan.sparse, plan.ks, plan.caps
    picked = [j for j, is_sparse in enumerate(sparse) if is_sparse]
    values, indices, measured = [], [], None
    if picked and shared is not None:  # the agreed indices: this rank's values there (0: it skips)
        for j in picked:
            seg, idx = acc[offsets[j]:offsets[j] + sizes[j]], shared[j]
            values.append(seg[idx] if ks[j] > 0 else torch.zeros(idx.numel(), device=acc.device))
            if ks[j] > 0:
                seg[idx] = 0.0
            indices.append(idx + (start + offsets[j]))
        values, indices = [torch.cat(values)], [torch.cat(indices)]
    elif picked:  # every sparse segment of the chunk in one selection (k = 0: padding only)
        segs = ([offsets[j] for j in picked], [sizes[j] for j in picked], [ks[j] for j in picked],
                [caps[j] for j in picked])
        if selector is None:
            v, i = TopKCodec.select_segments_(acc, *segs, backend)
        else:  # the counts are measured: the reported entries replace the planned k's
            v, i, sent = selector[0].select_segments_(acc, [selector[1][j] for j in picked], *segs, backend)
            measured = sent.sum() - sum(segs[2])
        values, indices = [v], [i.add_(start)]  # relative to the whole tensor
    dense_parts, sent_entries = [], sum(ks[j] for j in picked)
    for j, is_sparse in enumerate(sparse):
        if is_sparse:
            continue
        seg = acc[offsets[j]:offsets[j] + sizes[j]]
        if ks[j] > 0:  # a segment that went dense sends all of its entries
            dense_parts.append(seg.clone())
            seg.zero_()
            sent_entries += sizes[j]
        else:  # skipping this exchange: join the all-reduce with zeros, keep the gradient
            dense_parts.append(torch.zeros_like(seg))
    return Chunk(start, sizes, list(sparse), dense_parts, values, indices, marker, sent_entries,
                 shared=shared is not None, measured=None if measured is None else measured + sent_entries), acc


def _offsets(sizes: "list[int]") -> "list[int]":
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + n)
    return offsets


def _segments(sizes: "list[int]"):
    """j -> the slice of segment j in the flat tensor."""
    offsets = _offsets(sizes)
    return lambda j: slice(offsets[j], offsets[j] + sizes[j])
