"""scikit-learn's bundled digits (1,797 8x8 images, 10 classes) as tensors, and a ResNet for them.

Used by the recipes and the benchmarks: real data that ships with scikit-learn, so nothing is
downloaded. Images can be upsampled to 32x32 for a torchvision ResNet. Plain PyTorch (no
framework import), so bare-DDP workers load it in a fraction of Lightning's import time.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

__all__ = ["digits_datasets", "small_resnet"]


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
