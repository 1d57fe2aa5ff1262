"""One local step of the bare-DDP hybrid loop, as the hybrid tests drive it (docs/hybrid.md)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["flat_params", "regression_step", "sparse_hybrid_rank"]


def regression_step(runtime, ddp, opt, x: torch.Tensor) -> None:
    """Forward and backward of ``x -> sum(x)`` under ``runtime.local_step``, clipping, the step."""
    with runtime.local_step(ddp):
        nn.functional.mse_loss(ddp(x).squeeze(1), x.sum(1)).backward()
    runtime.before_optimizer_step(opt)
    opt.step()
    opt.zero_grad()


def flat_params(net: nn.Module) -> torch.Tensor:
    """A copy of every parameter of ``net``, flattened in order."""
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone()


def sparse_hybrid_rank(rank: int, world: int, density: float, codec: str = "topk"):
    """(runtime, net, ddp, optimizer) of one gloo rank in mode="hybrid" with Top-K deltas: periods
    of 2 local steps, then synchronous steps after one plateau evaluation (tests/oracle.make_net)."""
    from dist_utils import init_gloo
    from oracle import make_net
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[2, 1], plateau_thresholds=[0.05], plateau_evals=1,
                                 delta_density=density, delta_codec=codec)
    runtime = HeteroRuntime(cfg, rank, world)
    net = make_net()
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp)
    return runtime, net, ddp, torch.optim.SGD(ddp.parameters(), lr=0.1)
