"""Framework-free oracles shared by the Lightning and Accelerate tests: data, model, one-process SGD.

No batch statistics in the model, so hetero steps equal one-process steps to fp32 rounding.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset


def make_data(n: int = 80, features: int = 5, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def make_net(features: int = 5, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 8), nn.Tanh(), nn.Linear(8, 1))


def one_process_sgd(
    data: TensorDataset, global_batch: int, steps: int, *, lr: float = 0.1, shuffle: bool = False, seed: int = 0,
    accumulate: int = 1, clip: float | None = None, step_lr: tuple[int, float] | None = None,
    skip: frozenset[int] = frozenset(), momentum: float = 0.0,
) -> nn.Module:
    """The oracle: plain PyTorch, one process, batch G, the order a single DataLoader would use.

    ``skip``: optimizer steps whose batches are consumed but not applied (a dropped NaN step).

    ``step_lr`` (step_size, gamma) adds a StepLR stepped once per optimizer step; the learning
    rate after each step is kept in the returned module's ``lrs``.
    """
    net = make_net(data.tensors[0].shape[1])
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    sched = None if step_lr is None else torch.optim.lr_scheduler.StepLR(opt, step_lr[0], gamma=step_lr[1])
    net.lrs = []
    n = len(data)
    batches = []
    epoch = 0
    while len(batches) < steps * accumulate:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)) if shuffle \
            else torch.arange(n)
        batches += [order[i:i + global_batch] for i in range(0, n, global_batch)]
        epoch += 1
    x, y = data.tensors
    for s in range(steps):
        opt.zero_grad()
        for idx in batches[s * accumulate:(s + 1) * accumulate]:
            loss = nn.functional.mse_loss(net(x[idx]).squeeze(1), y[idx]) / accumulate
            loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        if s not in skip:
            opt.step()
        if sched is not None:
            sched.step()
        net.lrs.append(opt.param_groups[0]["lr"])
    return net


def weighted_reference(ref: nn.Module, x: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """Σ_r b_r g_r / G: each rank's mean-loss gradient on its slice of (x, y), weighted by its share."""
    grads = [torch.zeros_like(p) for p in ref.parameters()]
    for r in range(len(sizes)):
        lo = sum(sizes[:r])
        local = copy.deepcopy(ref)
        nn.functional.mse_loss(local(x[lo:lo + sizes[r]]), y[lo:lo + sizes[r]]).backward()
        for g, p in zip(grads, local.parameters()):
            g += p.grad * sizes[r] / sum(sizes)
    return grads
