"""Decompress: weighted scatter-add of all ranks' sparse payloads into a dense fp32 bucket.

``out[indices[r, j]] += weights[r] * values[r, j]`` for every row r (one row per rank) and slot j.

Determinism: rows are added one after another (one launch per row), in row order, so every
rank that decompresses the same gathered payload gets bitwise the same bucket (DDP needs
identical parameters on all ranks), and the result equals the reference. Within a row the
indices must be unique except for padding; padding slots (value 0, any index, typically 0)
are skipped by the kernel, which also keeps them from piling atomics onto ``out[0]``.
Out-of-range indices are masked off in the Triton path (memory safety) but raise in the
reference; do not rely on either. Weights must be finite (a zero-valued padding slot would
give ``0 * inf = NaN`` in the reference but is skipped in the kernel).

Example::

    >>> import torch
    >>> from hetero_strategy.triton_kernels.scatter_add import scatter_add_torch
    >>> out = torch.zeros(4)
    >>> v = torch.tensor([[1.0, 2.0], [3.0, 0.0]]); i = torch.tensor([[0, 3], [3, 0]], dtype=torch.int32)
    >>> scatter_add_torch(out, v, i, torch.tensor([0.5, 1.0])).tolist()
    [0.5, 0.0, 0.0, 4.0]
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_flat, check_launchable, launch, tl, triton

__all__ = ["scatter_add", "scatter_add_torch"]

VALUE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

if HAS_TRITON:

    @triton.jit
    def _scatter_add_kernel(
        # inputs: this row's payload (row views, so no row * width offset can overflow int32)
        values_ptr,
        indices_ptr,
        weights_ptr,
        # outputs
        out_ptr,
        # constants
        row,
        width,
        n,
        HAS_WEIGHTS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        in_row = cols < width
        v = tl.load(values_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
        idx = tl.load(indices_ptr + cols, mask=in_row, other=0)
        if HAS_WEIGHTS:
            v = v * tl.load(weights_ptr + row).to(tl.float32)
        live = in_row & (v != 0.0) & (idx >= 0) & (idx < n)  # NaN != 0: NaNs are added
        # NOTE: atomics only for memory safety; indices are unique within a row, so the sum is
        # order-free and the row-by-row launches make the whole result deterministic.
        tl.atomic_add(out_ptr + idx, v, mask=live, sem="relaxed")

else:  # pragma: no cover - only without Triton
    _scatter_add_kernel = None


def _check(out, values, indices, weights) -> None:
    check_flat("out", out, (torch.float32,))
    check_flat("values", values, VALUE_DTYPES, ndim=2)
    check_flat("indices", indices, (torch.int32, torch.int64), ndim=2)
    if values.shape != indices.shape:
        raise ValueError(
            f"indices: shape {tuple(indices.shape)} != values shape {tuple(values.shape)}; "
            "pass (R, capacity) for both"
        )
    if weights is not None:
        check_flat("weights", weights, (torch.float32,))
        if weights.numel() != values.shape[0]:
            raise ValueError(f"weights: {weights.numel()} entries for {values.shape[0]} rows; one per row")
    devices = {t.device for t in (out, values, indices, weights) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"tensors are on different devices {sorted(map(str, devices))}; move them to one")


def scatter_add_torch(out, values, indices, weights=None):
    """Reference: ``out.index_add_`` row by row (in place; returns ``out``)."""
    _check(out, values, indices, weights)
    for r in range(values.shape[0]):
        v = values[r].float()  # (capacity,) fp32
        if weights is not None:
            v = v * weights[r]
        out.index_add_(0, indices[r].long(), v)
    return out


def scatter_add(out, values, indices, weights=None, *, block: int = 1024):
    """Triton launcher (in place; returns ``out``), bitwise equal to :func:`scatter_add_torch`."""
    _check(out, values, indices, weights)
    if block <= 0 or block & (block - 1):
        raise ValueError(f"block: {block} is not a positive power of two; use e.g. 1024")
    check_launchable(_scatter_add_kernel, out, values, indices, *([] if weights is None else [weights]))
    rows, width = values.shape
    if width == 0:
        return out
    grid = (triton.cdiv(width, block),)
    for r in range(rows):
        launch(
            _scatter_add_kernel,
            grid,
            values[r], indices[r], weights if weights is not None else out, out, r, width, out.numel(),
            HAS_WEIGHTS=weights is not None, BLOCK=block, enable_fp_fusion=False,
        )
    return out
