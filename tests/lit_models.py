"""Small models and data shared by the Lightning tests (no batch statistics: exactness holds)."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int = 80, features: int = 5, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def make_net(features: int = 5, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 8), nn.Tanh(), nn.Linear(8, 1))


class Regressor(L.LightningModule):
    """MSE regression; records the size of every batch it trained on."""

    def __init__(self, lr: float = 0.1, features: int = 5) -> None:
        super().__init__()
        self.net = make_net(features)
        self.lr = lr
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(len(x))
        loss = nn.functional.mse_loss(self.net(x).squeeze(1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def one_process_sgd(
    data: TensorDataset, global_batch: int, steps: int, *, lr: float = 0.1, shuffle: bool = False, seed: int = 0,
    accumulate: int = 1, clip: float | None = None,
) -> nn.Module:
    """The oracle: plain PyTorch, one process, batch G, the order a single DataLoader would use."""
    net = make_net(data.tensors[0].shape[1])
    opt = torch.optim.SGD(net.parameters(), lr=lr)
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
        opt.step()
    return net


def trainer_kwargs(**extra):
    kw = dict(accelerator="cpu", devices=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, num_sanity_val_steps=0)
    kw.update(extra)
    return kw


def loader(data, batch_size: int, shuffle: bool = False, drop_last: bool = False) -> DataLoader:
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
