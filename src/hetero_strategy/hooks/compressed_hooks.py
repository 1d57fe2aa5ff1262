"""The hooks of :class:`CompressedState`: :func:`topk_hook` (topk, topk_allreduce, tiered) and :func:`onebit_hook`.

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
from hetero_strategy.hooks.codecs import SignCodec, ef_accumulate
from hetero_strategy.hooks.compressed import CompressedState
from hetero_strategy.hooks.exchange import Chunk, finish_exchange, issue_chunk, nonfinite_marker
from hetero_strategy.hooks.hierarchy import hierarchical_exchange
from hetero_strategy.hooks.topk_ef import TopKPlan, topk_ef_exchange

__all__ = ["onebit_hook", "topk_hook"]


def _warmup(state: CompressedState, bucket: dist.GradBucket, mode: str,
            fallback: int = 0) -> torch.futures.Future[torch.Tensor]:
    """Dense weighted all-reduce in place, no residuals: warm-up steps and dense tiers (``fallback``:
    entries sent so because compressing them does not pay)."""
    # NOTE: name the parameters now: step 0 always runs DDP's initial bucket layout, so the
    # first-seen order (the residuals' checkpoint keys) is the same in every run of this model
    keys = state.memory.keys(bucket)
    state.scale_bucket(bucket, clip=mode != "warmup")
    buf = bucket.buffer()
    if state.topk.momentum is not None:  # momentum_correction: every rank sends its velocity
        state.topk.momentum.dense_(bucket.index(), keys, buf, [g.numel() for g in bucket.gradients()])
    fut, sent = comm.all_reduce(buf, state.process_group)
    state.account(bucket, mode, sent, buf.numel(), fallback)
    return comm.then(fut, lambda: buf)


def topk_hook(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sample-weighted Top-K with error feedback (methods ``topk`` and ``tiered``).

    1. ``buffer *= b_r/G`` (after the optional clip, :meth:`CompressedState.scale_bucket`);
    2. per parameter: k from this rank's tier and the cosine schedule, capacity = max k over ranks;
       parameters where sparse would cost more than dense (cap x W >= n) go dense
       (:meth:`CompressedState.plan`);
    3. the Top-K exchange with error feedback (:func:`~hetero_strategy.hooks.topk_ef.topk_ef_exchange`):
       acc = buffer + gamma*residual; one all-gather of all sparse values + int32 indices (padded
       to capacity), one all-reduce of the dense parameters, a non-finite marker in one of them;
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
            if all(plan.whole):
                return _warmup(state, bucket, "dense_fallback", fallback=bucket.buffer().numel())
    state.scale_bucket(bucket, clip=True)
    if state.hier is not None:
        return hierarchical_exchange(state, bucket, step, mode, _compress)
    return _compress(state, bucket, step, mode, plan)


def _compress(state: CompressedState, bucket: dist.GradBucket, step: int, mode: str,
              plan: "TopKPlan | None" = None) -> torch.futures.Future:
    """Steps 1-4 of :func:`topk_hook` on an already weighted bucket, over ``state.exchange_group``
    (``plan``: this step's :meth:`CompressedState.plan` of the bucket, when already made)."""
    sizes = [g.numel() for g in bucket.gradients()]
    keys = state.memory.keys(bucket)
    fallback = 0
    if mode == "compressed":
        plan = plan or state.plan(step, sizes)
        fallback = sum(n for n, whole in zip(sizes, plan.whole) if whole)
        if state.hier is None:  # which parameters may now hold a residual (agreed: from the plan)
            for key, is_sparse in zip(keys, plan.sparse):
                (state.dirty.add if is_sparse else state.dirty.discard)(key)
    else:  # the periodic dense sync flushes every residual of the bucket
        plan = TopKPlan.dense(sizes)
        state.dirty.difference_update(keys)
    fut = topk_ef_exchange(state.topk, bucket.index(), keys, bucket.buffer(), sizes, plan,
                           state.policies[state.rank].gamma, state.stages_for(sizes, plan.sparse, plan.caps))
    state.account(bucket, "sparse" if any(plan.sparse) else mode, state.topk.last_bytes_sent,
                  state.topk.last_entries_sent, fallback, state.topk.last_entries_measured)
    return fut


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
    state.scale_bucket(bucket, clip=True)
    residual = state.memory.residual(bucket.index(), state.memory.keys(bucket), grads)
    acc = ef_accumulate(buf, residual, state.policies[state.rank].gamma, state.config.compression_backend)
    marker = nonfinite_marker(acc)
    if mode == "dense":  # periodic full-precision sync flushes the residual
        residual.copy_(torch.where(torch.isnan(marker), residual, torch.zeros_like(acc)))
        chunk = Chunk(0, sizes, [False] * len(sizes), [acc], [], [], marker, acc.numel())
        pending = issue_chunk(state.exchange_group, chunk)
        state.account(bucket, mode, pending.nbytes, acc.numel())
        return finish_exchange(buf, [pending], state.config.compression_backend)
    payload, kept = SignCodec.compress(acc.add(marker), sizes)  # a NaN marker makes the scales NaN
    residual.copy_(torch.where(torch.isnan(marker), residual, kept))
    fut, gathered, sent = comm.all_gather(payload, state.exchange_group)
    state.account(bucket, "onebit", sent, buf.numel())
    dtype = buf.dtype
    return comm.then(fut, lambda: SignCodec.decompress(gathered, sizes).to(dtype))
