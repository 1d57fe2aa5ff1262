"""Compaction: selected values + int32 indices into a fixed-capacity buffer, and the residual.

Given the ``state = [threshold_key, take_equal]`` of :mod:`.threshold`, one pass writes

* ``values[j]``, ``indices[j]``: the j-th selected element in **ascending index order**
  (slots ``>= count`` keep value 0 / index 0, so padded payloads are harmless to scatter-add);
* ``count``: 0-d int32 device tensor, the number of slots written (never read on the host);
* ``residual``: ``acc`` with every *sent* entry set to exactly 0 (not ``acc - acc``, which would
  turn an inf into NaN), so ``scatter(values) + residual == acc`` bitwise.

Order is made deterministic by a per-block prefix count: each block's number of ``key >
threshold`` and ``key == threshold`` elements (from :func:`.threshold.topk_threshold_with_counts`
at no extra read, or from a count kernel here), ``torch.cumsum`` over blocks on the device, and
an in-block prefix sum in the write kernel.

Capacity overflow: if more than ``capacity`` elements are selected, the first ``capacity`` in
index order are sent and the rest **stay in the residual** (nothing is lost; ``count ==
capacity``). No ``nonzero()`` and no host read in the Triton path.

Example::

    >>> import torch
    >>> from hetero_strategy.triton_kernels.threshold import topk_threshold_torch
    >>> from hetero_strategy.triton_kernels.compact import compact_torch
    >>> acc = torch.tensor([0.5, -3.0, 2.0, 2.0])
    >>> v, i, c, r = compact_torch(acc, topk_threshold_torch(acc, 2), capacity=3)
    >>> v.tolist(), i.tolist(), c.item(), r.tolist()
    ([-3.0, 2.0, 0.0], [1, 2, 0], 2, [0.5, 0.0, 0.0, 2.0])
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_flat, check_launchable, launch, tl, triton
from .threshold import abs_key, low_shift

__all__ = ["compact", "compact_torch"]

if HAS_TRITON:

    @triton.jit
    def _select_masks(acc_ptr, state_ptr, offs, n, LOW: tl.constexpr):
        valid = offs < n
        x = tl.load(acc_ptr + offs, mask=valid, other=0.0)
        key = (x.to(tl.int32, bitcast=True) & 0x7FFFFFFF) >> LOW
        thr = tl.load(state_ptr) >> LOW
        return x, valid & (key > thr), valid & (key == thr), valid

    @triton.jit
    def _count_kernel(
        # inputs
        acc_ptr,
        state_ptr,
        # outputs: (2, num_blocks) int32, row 0 = #(key > thr), row 1 = #(key == thr)
        counts_ptr,
        # constants
        n,
        num_blocks,
        LOW: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        _, gt, eq, _ = _select_masks(acc_ptr, state_ptr, offs, n, LOW)
        tl.store(counts_ptr + pid, tl.sum(gt.to(tl.int32), axis=0))
        tl.store(counts_ptr + num_blocks + pid, tl.sum(eq.to(tl.int32), axis=0))

    @triton.jit
    def _write_kernel(
        # inputs
        acc_ptr,
        state_ptr,
        counts_ptr,  # (2, num_blocks) int32 per-block #(key > T), #(key == T)
        incl_ptr,  # (2, num_blocks) int32 their inclusive cumulative sums over blocks
        # outputs
        values_ptr,
        indices_ptr,
        count_ptr,
        residual_ptr,
        # constants
        n,
        num_blocks,
        capacity,
        LOW: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        x, gt, eq, valid = _select_masks(acc_ptr, state_ptr, offs, n, LOW)
        take_eq = tl.load(state_ptr + 1)
        gt_before = tl.load(incl_ptr + pid) - tl.load(counts_ptr + pid)
        eq_before = tl.load(incl_ptr + num_blocks + pid) - tl.load(counts_ptr + num_blocks + pid)
        eq_i = eq.to(tl.int32)
        eq_rank = eq_before + tl.cumsum(eq_i, axis=0) - eq_i  # rank among ties, index order
        take = gt | (eq & (eq_rank < take_eq))
        take_i = take.to(tl.int32)
        pos = gt_before + tl.minimum(eq_before, take_eq) + tl.cumsum(take_i, axis=0) - take_i
        sent = take & (pos >= 0) & (pos < capacity)  # pos < 0 only for a malformed state
        tl.store(values_ptr + pos, x, mask=sent)
        tl.store(indices_ptr + pos, offs, mask=sent)
        tl.store(residual_ptr + offs, tl.where(sent, 0.0, x), mask=valid)
        tl.atomic_add(count_ptr, tl.sum(sent.to(tl.int32), axis=0), sem="relaxed")

else:  # pragma: no cover - only without Triton
    _count_kernel = _write_kernel = None


def _check(acc: torch.Tensor, state: torch.Tensor, capacity: int) -> None:
    check_flat("acc", acc, (torch.float32,))
    check_flat("state", state, (torch.int32,))
    if state.numel() != 2:
        raise ValueError(f"state: {state.numel()} elements; pass the (2,) tensor of topk_threshold")
    if not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity: {capacity!r} must be an int >= 0; size it as ceil(density * n) or more")


def _empty_outputs(acc: torch.Tensor, capacity: int):
    # NOTE: one zero-fill for all three (a launch saved per bucket): values, indices and count are
    # views of one int32 buffer; the bits of int32 0 are fp32 +0.0.
    buf = torch.zeros(2 * capacity + 1, dtype=torch.int32, device=acc.device)
    values = buf[:capacity].view(torch.float32)  # (capacity,) fp32
    indices = buf[capacity : 2 * capacity]  # (capacity,) int32
    return values, indices, buf[2 * capacity]


def compact_torch(acc: torch.Tensor, state: torch.Tensor, capacity: int, *, passes: int = 3):
    """Reference (uses ``nonzero``): returns ``(values, indices, count, residual)`` as described above."""
    _check(acc, state, capacity)
    shift = low_shift(passes)
    keys = abs_key(acc, passes)  # (n,) int32
    thr = state[0] >> shift
    take = keys > thr  # (n,) bool
    ties = torch.nonzero(keys == thr).flatten()[: int(state[1])]  # the first take_equal ties, index order
    take[ties] = True
    idx = torch.nonzero(take).flatten()[:capacity]  # ascending index order, first `capacity`
    values, indices, count = _empty_outputs(acc, capacity)
    m = idx.numel()
    values[:m] = acc[idx]
    indices[:m] = idx.to(torch.int32)
    count.fill_(m)
    residual = acc.clone()
    residual[idx] = 0.0
    return values, indices, count, residual


def compact(
    acc: torch.Tensor,
    state: torch.Tensor,
    capacity: int,
    *,
    passes: int = 3,
    block: int = 4096,
    counts: torch.Tensor | None = None,
):
    """Triton launcher: same outputs as :func:`compact_torch`, bitwise.

    Reads ``acc`` twice (count, then write) and writes the residual once; ``block`` (power of
    two) is the number of elements per program. ``counts``, the (2, cdiv(n, block)) int32
    per-block ``#(key > T)`` / ``#(key == T)`` from
    :func:`.threshold.topk_threshold_with_counts` with the same ``block``, skips the count read.
    """
    _check(acc, state, capacity)
    shift = low_shift(passes)
    if block <= 0 or block & (block - 1):
        raise ValueError(f"block: {block} is not a positive power of two; use e.g. 4096")
    check_launchable(_write_kernel, acc, state)
    n = acc.numel()
    values, indices, count = _empty_outputs(acc, capacity)
    residual = torch.empty_like(acc)  # (n,) fp32
    if n == 0:
        return values, indices, count, residual
    num_blocks = triton.cdiv(n, block)
    if counts is None:
        counts = torch.empty(2, num_blocks, dtype=torch.int32, device=acc.device)
        launch(_count_kernel, (num_blocks,), acc, state, counts, n, num_blocks, LOW=shift, BLOCK=block)
    elif counts.shape != (2, num_blocks) or counts.dtype != torch.int32 or not counts.is_contiguous():
        raise ValueError(
            f"counts: shape {tuple(counts.shape)} {counts.dtype}, expected contiguous (2, {num_blocks}) int32; "
            "compute it with the same block size"
        )
    incl = torch.cumsum(counts, dim=1, dtype=torch.int32)  # (2, num_blocks), on the device
    launch(
        _write_kernel,
        (num_blocks,),
        acc, state, counts, incl, values, indices, count, residual, n, num_blocks, capacity,
        LOW=shift, BLOCK=block,
    )
    return values, indices, count, residual
