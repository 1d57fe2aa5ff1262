"""The Top-K exchange of one bucket: issue the collectives now, decode when they complete.

At most two collectives per bucket, issued from the hook call in the same order on every rank
(gloo requires it): one all-gather of every sparse parameter's values + int32 indices, one
all-reduce of the dense parameters. A non-finite marker (0 or NaN, a (1,) tensor computed on the
device, no host sync) rides in one of them, so a NaN/inf on any rank marks the bucket everywhere.

Example::

    marker = nonfinite_marker(acc)            # (1,) fp32
    fut = exchange_topk(state, bucket, "compressed", sizes, sparse, dense_parts, values, indices,
                        marker, sent_entries)  # fut.value(): the reduced (n,) bucket
"""

# NOTE: no `from __future__ import annotations`, like the hook modules (DDP inspects annotations).
import torch

from hetero_strategy.hooks import communicator as comm
from hetero_strategy.hooks.codecs import TopKCodec

__all__ = ["exchange_topk", "nonfinite_marker"]


def nonfinite_marker(acc: torch.Tensor) -> torch.Tensor:
    """(1,) fp32: NaN if acc holds a NaN/inf, else 0 (stays on device: no host sync)."""
    # NOTE: the sum is non-finite iff an entry is (or |sum| > 3.4e38, far beyond any gradient);
    # one reduction, no (n,) boolean temporary
    bad = ~torch.isfinite(acc.sum())
    return torch.where(bad, torch.full((1,), float("nan"), device=acc.device), torch.zeros(1, device=acc.device))


def exchange_topk(state, bucket, mode, sizes, sparse, dense_parts, values, indices, marker, sent_entries):
    """Issue the (at most two) collectives now, in the same order on every rank; decode later."""
    buf = bucket.buffer()
    numel, dtype, group = buf.numel(), buf.dtype, state.exchange_group
    gathered = reduced = None
    futs, nbytes = [], 0
    if values:  # marker rides in the gather when there is one, else in the all-reduce
        payload = torch.cat([TopKCodec.pack(torch.cat(values), torch.cat(indices)), marker])
        fut, gathered, sent = comm.all_gather(payload, group)
        futs.append(fut)
        nbytes += sent
    if dense_parts or not values:
        reduced = torch.cat(dense_parts + ([] if values else [marker]))
        fut, sent = comm.all_reduce(reduced, group)
        futs.append(fut)
        nbytes += sent
    state._account(bucket, "sparse" if values else mode, nbytes, sent_entries)

    def decode(_f: torch.futures.Future) -> torch.Tensor:
        # the bucket's buffer is free again (payloads were copied out): decode into it
        out = buf.zero_() if dtype == torch.float32 else torch.zeros(numel, dtype=torch.float32, device=buf.device)
        offset, pos = 0, 0
        for n, is_sparse in zip(sizes, sparse):
            if not is_sparse:
                out[offset:offset + n] = reduced[pos:pos + n]
                pos += n
            offset += n
        if gathered is not None:
            TopKCodec.decompress(gathered[:, :-1], numel, state.config.compression_backend, out=out)
            out.add_(gathered[:, -1].sum())  # any rank's NaN marks the whole bucket
        else:
            out.add_(reduced[-1])  # the marker (dense parts alone miss a NaN in a skipped part)
        return out.to(dtype)

    return torch.futures.collect_all(futs).then(decode)


