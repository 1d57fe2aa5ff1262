"""One local step of the bare-DDP hybrid loop, as the hybrid tests drive it (docs/hybrid.md)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["regression_step"]


def regression_step(runtime, ddp, opt, x: torch.Tensor) -> None:
    """Forward and backward of ``x -> sum(x)`` under ``runtime.local_step``, clipping, the step."""
    with runtime.local_step(ddp):
        nn.functional.mse_loss(ddp(x).squeeze(1), x.sum(1)).backward()
    runtime.before_optimizer_step(opt)
    opt.step()
    opt.zero_grad()
