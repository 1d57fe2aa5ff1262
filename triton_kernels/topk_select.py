"""Top-k selection with error feedback = :mod:`.threshold` then :mod:`.compact`.

Selects exactly ``min(k, n)`` entries of largest ``|acc|`` (NaN ranks above +inf, +inf above
every finite value; ties broken by lower index), sends at most ``capacity`` of them (the first
in index order) and returns the residual with the sent entries zeroed.

Example::

    >>> import torch
    >>> from hetero_strategy.triton_kernels.topk_select import topk_select_torch
    >>> v, i, c, r = topk_select_torch(torch.tensor([1.0, float("nan"), -4.0, 3.0]), k=2, capacity=2)
    >>> i.tolist(), c.item(), r.tolist()
    ([1, 2], 2, [1.0, 0.0, 0.0, 3.0])
"""

from __future__ import annotations

import torch

from .compact import compact, compact_torch
from .threshold import topk_threshold_torch, topk_threshold_with_counts

__all__ = ["topk_select", "topk_select_torch"]


def _check_k(k: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k: {k!r} must be an int >= 0; compute it as ceil(density * numel)")


def topk_select_torch(acc: torch.Tensor, k: int, capacity: int, *, passes: int = 3):
    """Reference path (``torch.topk`` + ``nonzero``): ``(values, indices, count, residual)``."""
    _check_k(k)
    return compact_torch(acc, topk_threshold_torch(acc, k, passes=passes), capacity, passes=passes)


def topk_select(acc: torch.Tensor, k: int, capacity: int, *, passes: int = 3, block: int = 4096):
    """Triton path, no host sync: 2 histogram reads (+ candidates), 1 compaction read, 1 residual write.

    With ``passes < 3`` (or k = 0 / k >= n) the compaction counts need one more read of ``acc``.
    """
    _check_k(k)
    state, counts = topk_threshold_with_counts(acc, k, passes=passes, block=block)
    return compact(acc, state, capacity, passes=passes, block=block, counts=counts)
