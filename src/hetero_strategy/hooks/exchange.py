"""The wire of one Top-K exchange, in chunks: issue each chunk's collectives as soon as it is
encoded, decode each chunk as soon as its collectives complete (used by
:func:`~hetero_strategy.hooks.topk_ef.topk_ef_exchange`, and by the 1-bit hook's dense sync).

A bucket is cut into *chunks* of whole parameters (:func:`chunk_bounds`; one chunk unless
``pipeline_stages`` asks for more). Per chunk at most two collectives, issued from the hook call
in the same order on every rank (gloo requires it): one all-gather of its sparse parameters'
values + int32 indices, one all-reduce of its dense parameters (with shared indices, one
all-reduce of both: the values sit at the same indices on every rank). While chunk i is on the wire the
hook encodes chunk i+1: the codec overlaps the communication. Selection is per parameter, so the
result does not depend on the chunking (tested bitwise on 2 ranks; with more ranks gloo's ring
may sum a dense part's entries in another order, so results can differ in the last bit, while
every rank still agrees).

A non-finite marker (0 or NaN, a (1,) tensor computed on the device, no host sync) rides in each
chunk's payload; any chunk's NaN on any rank marks the whole bucket NaN everywhere.

Example::

    chunk = Chunk(start, sizes, sparse, dense_parts, values, indices, marker, sent_entries)
    pending = [issue_chunk(group, chunk)]        # at once: the collectives start
    fut = finish_exchange(flat, pending)          # fut.value(): the reduced (n,) tensor
"""

# NOTE: no `from __future__ import annotations`, like the hook modules (DDP inspects annotations).
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hetero_strategy.hooks import communicator as comm
from hetero_strategy.hooks.codecs import TopKCodec

__all__ = ["Chunk", "Pending", "chunk_bounds", "finish_exchange", "issue_chunk", "nonfinite_marker"]


def nonfinite_marker(acc: torch.Tensor) -> torch.Tensor:
    """(1,) fp32: NaN if acc holds a NaN/inf, else 0 (stays on device: no host sync)."""
    # NOTE: the sum is non-finite iff an entry is (or |sum| > 3.4e38, far beyond any gradient);
    # one reduction, no (n,) boolean temporary
    bad = ~torch.isfinite(acc.sum())
    return torch.where(bad, torch.full((1,), float("nan"), device=acc.device), torch.zeros(1, device=acc.device))


def chunk_bounds(sizes: "list[int]", stages: int) -> "list[tuple[int, int]]":
    """Parameter index ranges [a, b) cutting a bucket into at most ``stages`` chunks of about equal
    entries (never inside a parameter: selection is per parameter)."""
    total = sum(sizes)
    bounds, start, seen = [], 0, 0
    for j, n in enumerate(sizes):
        seen += n
        # close a chunk once it reaches its share of the bucket
        if len(bounds) < stages - 1 and seen >= total * (len(bounds) + 1) / stages and j + 1 < len(sizes):
            bounds.append((start, j + 1))
            start = j + 1
    bounds.append((start, len(sizes)))
    return bounds


@dataclass
class Chunk:
    """One encoded chunk: parameters ``sizes`` from bucket offset ``start``."""

    start: int
    sizes: "list[int]"
    sparse: "list[bool]"
    dense_parts: "list[torch.Tensor]"
    values: "list[torch.Tensor]"
    indices: "list[torch.Tensor]"  # bucket-relative
    marker: torch.Tensor
    sent_entries: int
    shared: bool = False
    """The sparse values sit at indices every rank shares (``topk_allreduce``): they are summed in
    the chunk's one all-reduce, beside its dense parts, instead of being gathered."""
    measured: "torch.Tensor | None" = None
    """Entries actually sent, when the selection does not fix them (threshold reuse): a 0-d device
    count beside ``sent_entries`` (the planned ones); None: ``sent_entries`` were sent."""


@dataclass
class Pending:
    """A chunk whose collectives are on the wire: their futures, outputs and bytes (ring counts)."""

    chunk: Chunk
    futs: "list[torch.futures.Future]"
    gathered: "torch.Tensor | None"
    reduced: "torch.Tensor | None"
    nbytes: int


def issue_chunk(group: "dist.ProcessGroup | None", chunk: Chunk) -> Pending:
    """Start the chunk's (at most two) collectives over ``group`` now; the marker rides in the
    gather if any."""
    gathered = reduced = None
    futs, nbytes = [], 0
    if chunk.shared:  # values, dense parts and the marker: one all-reduce
        reduced = torch.cat(chunk.values + chunk.dense_parts + [chunk.marker])
        fut, nbytes = comm.all_reduce(reduced, group)
        return Pending(chunk, [fut], None, reduced, nbytes)
    if chunk.values:
        payload = torch.cat([TopKCodec.pack(torch.cat(chunk.values), torch.cat(chunk.indices)), chunk.marker])
        fut, gathered, sent = comm.all_gather(payload, group)
        futs.append(fut)
        nbytes += sent
    if chunk.dense_parts or not chunk.values:
        reduced = torch.cat(chunk.dense_parts + ([] if chunk.values else [chunk.marker]))
        fut, sent = comm.all_reduce(reduced, group)
        futs.append(fut)
        nbytes += sent
    return Pending(chunk, futs, gathered, reduced, nbytes)


def finish_exchange(buf: torch.Tensor, pending: "list[Pending]", backend: str = "auto") -> torch.futures.Future:
    """Decode each chunk into ``buf`` (n,) as soon as its own collectives complete, and return it
    (in its dtype) once every chunk is in.

    NOTE: call it only once the chunks' residuals are stored: a chunk's decode reuses its region of
    ``buf``, which held the chunk's error-fed accumulator until then. Chunks that have already
    arrived are decoded here, while the last one is still on the wire.
    """
    numel, dtype = buf.numel(), buf.dtype
    # the buffer is free again (payloads were copied out): decode into it
    out = buf if dtype == torch.float32 else torch.zeros(numel, dtype=torch.float32, device=buf.device)

    def decode(p: Pending) -> torch.Tensor:
        c, offset, pos = p.chunk, p.chunk.start, 0
        if p.gathered is not None or c.shared:  # sparse entries land on zeros; dense parts overwrite
            out[c.start:c.start + sum(c.sizes)].zero_()
        if c.shared and c.values:  # the summed values lead the all-reduce, at the shared indices
            pos = c.values[0].numel()
            out.index_copy_(0, c.indices[0], p.reduced[:pos])
        for n, is_sparse in zip(c.sizes, c.sparse):
            if not is_sparse:
                out[offset:offset + n] = p.reduced[pos:pos + n]
                pos += n
            offset += n
        if p.gathered is None:
            return p.reduced[-1:]  # the marker (dense parts alone miss a NaN in a skipped part)
        # indices stay inside this chunk's parameters, so chunks decoding at once never overlap
        TopKCodec.decompress(p.gathered[:, :-1], numel, backend, out=out)
        return p.gathered[:, -1].sum().view(1)  # any rank's NaN

    def close(decoded: torch.futures.Future) -> torch.Tensor:
        marker = torch.cat([f.value() for f in decoded.value()]).sum()
        # any chunk's NaN marks the whole bucket; on the CPU the check is free and saves a pass
        if out.device.type != "cpu" or torch.isnan(marker):
            out.add_(marker)
        return out.to(dtype)

    decoded = [comm.then(torch.futures.collect_all(p.futs), lambda p=p: decode(p)) for p in pending]
    return torch.futures.collect_all(decoded).then(close)
