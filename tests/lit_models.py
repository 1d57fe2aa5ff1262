"""Small models and data shared by the Lightning tests (no batch statistics: exactness holds)."""

from __future__ import annotations

import lightning as L
import torch
from oracle import make_data, make_net, one_process_sgd
from torch import nn
from torch.utils.data import DataLoader

__all__ = ["Regressor", "error_of", "loader", "make_data", "make_net", "one_process_sgd", "trainer_kwargs"]


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


def trainer_kwargs(**extra):
    kw = dict(accelerator="cpu", devices=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, num_sanity_val_steps=0)
    kw.update(extra)
    return kw


def loader(data, batch_size: int, shuffle: bool = False, drop_last: bool = False) -> DataLoader:
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)


def error_of(fn) -> str:
    """``"Type: message"`` of what ``fn()`` raises, or "" (the tests inspect the message)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects the message
        return f"{type(e).__name__}: {e}"
    return ""
