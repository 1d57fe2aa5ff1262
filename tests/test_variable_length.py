"""Variable-length samples dealt out by cost stay exact: 2 gloo ranks over bare DDP against one
process, for a mean-over-samples and a mean-over-tokens loss (docs/design.md semantics 3 with
``balance.sample_cost``)."""

from __future__ import annotations

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from torch import nn

N, G, STEPS = 40, 16, 5  # G = 8 per rank x 2; 5 steps cross an epoch (40 samples = 2.5 steps)
SIZES = [10, 6]


class Sequences(torch.utils.data.Dataset):
    """Token sequences with skewed lengths (many short, a few long) and a target per token."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.lengths = [int(x) for x in torch.tensor([2, 3, 4, 40])[torch.randint(0, 4, (N,), generator=g)]]
        self.tokens = [torch.randint(0, 20, (n,), generator=g) for n in self.lengths]
        self.targets = [torch.randn(n, generator=g) for n in self.lengths]

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return self.tokens[i], self.targets[i]


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(20, 6), nn.Tanh(), nn.Linear(6, 1))


def _loss(net: nn.Module, batch: list, normalization: str) -> torch.Tensor:
    if normalization == "tokens":  # every token of the batch counts once
        err = torch.cat([(net(t).squeeze(-1) - y) ** 2 for t, y in batch])
        return err.mean()
    return torch.stack([((net(t).squeeze(-1) - y) ** 2).mean() for t, y in batch]).mean()  # per sample, then mean


def _train(rank: int, world: int, normalization: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    data = Sequences()
    net = _net()
    cfg = HeteroConfig.from_flat(batch_sizes=SIZES, sample_cost="lengths", loss_normalization=normalization)
    runtime = HeteroRuntime(cfg, rank, world)
    loader = runtime.train_loader(DataLoader(data, batch_size=G // world, shuffle=True, collate_fn=list), seed=0)
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp, max_steps=STEPS)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    seen, costs = [], []
    while len(seen) < STEPS:
        for batch in loader:
            runtime.batch_start()
            seen.append(len(batch))
            costs.append(sum(len(t) for t, _ in batch))
            _loss(ddp, batch, normalization).backward()
            opt.step()
            opt.zero_grad()
            runtime.step_end()
            if len(seen) == STEPS:
                break
        loader.batch_sampler.set_epoch(loader.batch_sampler.epoch + 1)
    return {"weights": [p.detach().clone() for p in net.parameters()], "seen": seen, "costs": costs}


def _one_process(normalization: str) -> nn.Module:
    data, net = Sequences(), _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    batches, epoch = [], 0
    while len(batches) < STEPS:  # the order one DataLoader(shuffle=True) process would use
        order = torch.randperm(N, generator=torch.Generator().manual_seed(epoch)).tolist()
        batches += [order[i:i + G] for i in range(0, N, G)]
        epoch += 1
    for idx in batches[:STEPS]:
        opt.zero_grad()
        _loss(net, [data[i] for i in idx], normalization).backward()
        opt.step()
    return net


@pytest.mark.parametrize("normalization", ["samples", "tokens"])
def test_dealt_by_cost_equals_one_process(normalization):
    ranks = run_distributed(_train, 2, normalization, timeout=120)
    want = _one_process(normalization)
    for r in ranks:
        for got, ref in zip(r["weights"], want.parameters()):
            torch.testing.assert_close(got, ref.detach(), rtol=1e-5, atol=1e-6)
    # the deal follows cost, not count: the 10-share rank did not simply take 10 samples each step
    assert [a + b for a, b in zip(ranks[0]["seen"], ranks[1]["seen"])] == [16, 16, 8, 16, 16]
    assert ranks[0]["seen"] != [10, 10, 5, 10, 10]
