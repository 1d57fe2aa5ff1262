"""``FlatBucket``: what a comm hook reads of ``dist.GradBucket``, over one flat buffer, so a hook's
exchange runs outside DDP (``bench overlap``, tests).

Example::

    bucket = FlatBucket(torch.randn(30), [torch.empty(0)] * 3, sizes=[10, 7, 13])
    fut = topk_hook(state, bucket)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["FlatBucket"]


class FlatBucket:
    """A flat fp32 buffer and its parameters; each gradient is a view of the buffer, shaped like
    its parameter when ``sizes`` (default: the parameters' numels) matches it, else flat."""

    def __init__(self, buffer: torch.Tensor, params: Sequence[torch.Tensor], sizes: Sequence[int] | None = None,
                 index: int = 0) -> None:
        self._buffer, self._params, self._index = buffer, list(params), index
        sizes = [p.numel() for p in self._params] if sizes is None else list(sizes)
        self._grads = [g.view_as(p) if p.numel() == n else g
                       for g, p, n in zip(buffer.split(sizes), self._params, sizes, strict=True)]

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return True
