"""scikit-learn's bundled digits (1,797 8x8 images, 10 classes) as tensors and a LightningModule.

Used by ``make demo`` and the benchmarks: real data that ships with scikit-learn, so nothing is
downloaded. Images can be upsampled to 32x32 for a torchvision ResNet.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import TensorDataset

__all__ = ["DigitsClassifier", "digits_datasets", "small_resnet"]


def digits_datasets(size: int = 8, test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) datasets of (image (1, size, size) float32 in [0, 1], label int64)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0  # (N, 1, 8, 8)
    if size != 8:
        images = nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.tensor(y, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def small_resnet(arch: str = "resnet18", num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """A torchvision ResNet for 32x32 input (3x3 stem, no max-pool, as for CIFAR)."""
    import torchvision

    net = getattr(torchvision.models, arch)(num_classes=num_classes)
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


def _mlp(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, num_classes))


class DigitsClassifier(L.LightningModule):
    """Cross-entropy classifier on digits; ``arch`` is "mlp" (8x8 input) or a torchvision ResNet name."""

    def __init__(self, arch: str = "mlp", lr: float = 0.05, momentum: float = 0.9, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(seed)
        self.net = _mlp() if arch == "mlp" else small_resnet(arch)
        self.correct = 0
        self.total = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # (B, 10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self(x).argmax(dim=1)
        self.correct += int((pred == y).sum())
        self.total += len(y)

    def on_validation_epoch_end(self) -> None:
        counts = torch.tensor([self.correct, self.total], dtype=torch.float64, device=self.device)
        counts = self.trainer.strategy.reduce(counts, reduce_op="sum")
        self.log("val_acc", float(counts[0] / counts[1].clamp(min=1)), prog_bar=True, sync_dist=True)  # identical on all ranks
        self.correct = self.total = 0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)
