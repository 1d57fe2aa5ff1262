"""The hooks of :class:`CompressedState`: :func:`topk_hook` (topk, tiered) and :func:`onebit_hook`.

The modes a bucket takes each step, the weighting and the non-finite rule are described in
:mod:`hetero_strategy.hooks.compressed`, beside the state that decides them.

Example::

    state = CompressedState(method="tiered", tiers=["ib", "eth1g"])
    ddp_model.register_comm_hook(state, topk_hook)
"""

# NOTE: no `from __future__ import annotations`: DDP checks the hook's real annotation objects.
import torch
import torch.distributed as dist

from hetero_strategy.hooks import communicator as comm
from hetero_strategy.hooks.codecs import SignCodec, TopKCodec, ef_accumulate, ef_accumulate_
from hetero_strategy.hooks.compressed import CompressedState
from hetero_strategy.hooks.exchange import Chunk, chunk_bounds, finish_exchange, issue_chunk, nonfinite_marker
from hetero_strategy.hooks.hierarchy import hierarchical_exchange

__all__ = ["onebit_hook", "topk_hook"]


def _warmup(state: CompressedState, bucket: dist.GradBucket, mode: str) -> torch.futures.Future[torch.Tensor]:
    """Dense weighted all-reduce in place, no residuals: warm-up steps and dense tiers."""
    # NOTE: name the parameters now: step 0 always runs DDP's initial bucket layout, so the
    # first-seen order (the residuals' checkpoint keys) is the same in every run of this model
    state.memory.keys(bucket)
    state._scale(bucket, clip=mode != "warmup")
    buf = bucket.buffer()
    fut, sent = comm.all_reduce(buf, state.process_group)
    state._account(bucket, mode, sent, buf.numel())
    return comm.then(fut, lambda: buf)


def topk_hook(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sample-weighted Top-K with error feedback (methods ``topk`` and ``tiered``).

    1. ``buffer *= b_r/G`` (after the optional clip); acc = buffer + gamma*residual (fp32);
    2. per parameter: k from this rank's tier and the cosine schedule, capacity = max k over ranks;
       parameters where sparse would cost more than dense (cap x W >= n) go dense;
    3. one all-gather of all sparse values + int32 indices (padded to capacity), one all-reduce
       of the dense parameters; a non-finite marker rides in one of them;
    4. residual = acc minus what was sent; result = dense sums + all ranks' sparse entries.

    Example::

        state = CompressedState(method="tiered", tiers=["ib", "eth1g"])
        ddp_model.register_comm_hook(state, topk_hook)
    """
    return state.streams.run(bucket.buffer(), lambda: _topk(state, bucket))  # side_streams: on a side stream


def _topk(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future:
    step = state.step
    state.record_bucket(bucket)
    mode = state.mode(step)
    # NOTE: a dense-tier rank beside sparse ones must run the same collectives as they do
    # (_compress: its density 1 sends every parameter densely); only an all-dense exchange may
    # take the plain all-reduce.
    if mode == "warmup" or (state.hier is None and state.all_dense()):
        return _warmup(state, bucket, mode)
    plan = None
    if state.hier is None and state.cost is not None:
        clean = state.dirty.isdisjoint(state.memory.keys(bucket))
        if clean and mode == "dense":  # a dense sync with no residual to flush: the plain all-reduce
            return _warmup(state, bucket, mode)
        if clean and mode == "compressed":
            plan = state.plan(step, [g.numel() for g in bucket.gradients()])  # reused by _compress
            # every parameter goes whole because compressing does not pay: no codec work at all
            if all(plan[3]):
                state._acc_fallback += bucket.buffer().numel()
                return _warmup(state, bucket, "dense_fallback")
    state._scale(bucket, clip=True)
    if state.hier is not None:
        return hierarchical_exchange(state, bucket, step, mode, _compress)
    return _compress(state, bucket, step, mode, plan)


def _compress(state: CompressedState, bucket: dist.GradBucket, step: int, mode: str,
              plan: "tuple | None" = None) -> torch.futures.Future:
    """Steps 1-4 of :func:`topk_hook` on an already weighted bucket, over ``state.exchange_group``
    (``plan``: this step's :meth:`CompressedState.plan` of the bucket, when already made)."""
    buf, grads = bucket.buffer(), bucket.gradients()
    policy = state.policies[state.rank]
    sizes = [g.numel() for g in grads]
    keys = state.memory.keys(bucket)
    if mode == "compressed":
        sparse, ks, caps, whole = plan or state.plan(step, sizes)
        state._acc_fallback += sum(n for n, w in zip(sizes, whole) if w)
        if state.hier is None:  # which parameters may now hold a residual (agreed: from the plan)
            for key, is_sparse in zip(keys, sparse):
                (state.dirty.add if is_sparse else state.dirty.discard)(key)
    else:  # the periodic dense sync flushes every residual of the bucket
        sparse, ks, caps = [False] * len(sizes), sizes, sizes
        state.dirty.difference_update(keys)
    residual = state.memory.residual(bucket.index(), keys, grads)  # (n,) fp32
    pending, kept = [], []
    # NOTE: each chunk's collectives start as soon as it is encoded, so the next chunk's codec work
    # overlaps them (one chunk unless pipeline_stages asks for more)
    for chunk, res, acc in encode_chunks(state, buf, residual, sizes, sparse, ks, caps, policy.gamma,
                                         state.stages_for(sizes, sparse, caps)):
        pending.append(issue_chunk(state, chunk))
        kept.append((chunk.marker, res, acc))
    store_residuals(kept)
    return finish_exchange(state, bucket, mode, pending)


def encode_chunks(state: CompressedState, buf: torch.Tensor, residual: torch.Tensor, sizes: "list[int]",
                  sparse: "list[bool]", ks: "list[int]", caps: "list[int]", gamma: float, stages: int):
    """Encode the bucket chunk after chunk (:func:`chunk_bounds`); yields (chunk, its slice of the
    residual, its accumulator), so a caller can send each chunk before the next is encoded."""
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + n)
    for lo, hi in chunk_bounds(sizes, stages):
        start, end = offsets[lo], offsets[hi - 1] + sizes[hi - 1]
        chunk, acc = _encode(state, buf[start:end], residual[start:end], start, sizes[lo:hi], sparse[lo:hi],
                             ks[lo:hi], caps[lo:hi], gamma)
        yield chunk, residual[start:end], acc


def store_residuals(kept: "list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]") -> None:
    """Each chunk's accumulator becomes its residual, from (marker, residual slice, acc) per chunk.

    Never store a non-finite step: a NaN anywhere in this rank's bucket keeps all of its old
    residual (as one chunk would), so the chunking cannot change what a skipped step leaves behind.
    """
    bad = torch.isnan(torch.stack([marker for marker, _, _ in kept]).sum())
    if kept[0][1].device.type == "cpu":  # the check is free here, and a copy is half a where's passes
        if not bad:
            for _, res, acc in kept:
                res.copy_(acc)
        return
    for _, res, acc in kept:  # no host sync on an accelerator
        torch.where(bad, res, acc, out=res)


def _encode(state: CompressedState, buf: torch.Tensor, residual: torch.Tensor, start: int, sizes: "list[int]",
            sparse: "list[bool]", ks: "list[int]", caps: "list[int]", gamma: float) -> "tuple[Chunk, torch.Tensor]":
    """Error feedback and selection of one chunk of whole parameters; (the chunk, acc with its sent
    entries zeroed: the chunk's new residual once the bucket is known to be finite)."""
    backend = state.config.compression_backend
    acc = ef_accumulate_(buf, residual, gamma, backend)  # (m,) fp32, in buf when it is fp32
    marker = nonfinite_marker(acc)
    # acc becomes what stays in the residual: sent entries are zeroed in place below
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + n)
    picked = [j for j, is_sparse in enumerate(sparse) if is_sparse]
    values, indices = [], []
    if picked:  # every sparse parameter of the chunk in one selection (k = 0: padding only)
        v, i = TopKCodec.select_segments_(acc, [offsets[j] for j in picked], [sizes[j] for j in picked],
                                          [ks[j] for j in picked], [caps[j] for j in picked], backend)
        values, indices = [v], [i.add_(start)]  # bucket-relative
    dense_parts, sent_entries = [], sum(ks[j] for j in picked)
    for j, is_sparse in enumerate(sparse):
        if is_sparse:
            continue
        seg = acc[offsets[j]:offsets[j] + sizes[j]]
        if ks[j] > 0:  # a parameter that went dense sends all of its entries
            dense_parts.append(seg.clone())
            seg.zero_()
            sent_entries += sizes[j]
        else:  # skipping this exchange: join the all-reduce with zeros, keep the gradient
            dense_parts.append(torch.zeros_like(seg))
    return Chunk(start, sizes, sparse, dense_parts, values, indices, marker, sent_entries), acc


def onebit_hook(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sample-weighted 1-bit sign compression with error feedback (method ``onebit``).

    1. ``buffer *= b_r/G``; acc = buffer + gamma*residual;
    2. payload = packed signs of acc + one scale (mean |acc|) per parameter; residual = acc - scale*sign;
    3. one all-gather; result = sum over ranks of scale_r * sign_r (a NaN scale marks the bucket).

    Example::

        state = CompressedState(method="onebit")
        ddp_model.register_comm_hook(state, onebit_hook)
    """
    return state.streams.run(bucket.buffer(), lambda: _onebit(state, bucket))


def _onebit(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future:
    step = state.step
    state.record_bucket(bucket)
    mode = state.mode(step)
    # signs cost n/8 bytes per rank to gather vs ~8n/W for a ring all-reduce of fp32
    if mode == "warmup" or state.world >= 64:
        return _warmup(state, bucket, mode)
    buf, grads = bucket.buffer(), bucket.gradients()
    sizes = [g.numel() for g in grads]
    state._scale(bucket, clip=True)
    residual = state.memory.residual(bucket.index(), state.memory.keys(bucket), grads)
    acc = ef_accumulate(buf, residual, state.policies[state.rank].gamma, state.config.compression_backend)
    marker = nonfinite_marker(acc)
    if mode == "dense":  # periodic full-precision sync flushes the residual
        residual.copy_(torch.where(torch.isnan(marker), residual, torch.zeros_like(acc)))
        chunk = Chunk(0, sizes, [False] * len(sizes), [acc], [], [], marker, acc.numel())
        return finish_exchange(state, bucket, mode, [issue_chunk(state, chunk)])
    payload, kept = SignCodec.compress(acc.add(marker), sizes)  # a NaN marker makes the scales NaN
    residual.copy_(torch.where(torch.isnan(marker), residual, kept))
    fut, gathered, sent = comm.all_gather(payload, state.exchange_group)
    state._account(bucket, "onebit", sent, buf.numel())
    dtype = buf.dtype
    return comm.then(fut, lambda: SignCodec.decompress(gathered, sizes).to(dtype))
