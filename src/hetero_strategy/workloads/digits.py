"""scikit-learn's bundled digits (1,797 8x8 images, 10 classes) as tensors: the one digits loader.

Used by the demo, the recipes and the benchmarks: real data that ships with scikit-learn, so
nothing is downloaded. Images can be upsampled to 32x32 for a ResNet (:mod:`.resnets`). Plain
PyTorch (no framework import), so bare-DDP workers load it in a fraction of Lightning's import time.

Example::

    train, test = digits_datasets(size=32)                   # 80/20, the same split everywhere
    train = covering(train, steps * global_batch)            # one epoch covers the run
    print(accuracy(net, test))
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

__all__ = ["accuracy", "covering", "digits_datasets"]


def digits_datasets(size: int = 8, test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) datasets of (image (1, size, size) float32 in [0, 1], label int64).

    The split is a permutation drawn from ``seed``: its first ``test_fraction`` is the test set.
    """
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


def covering(data: TensorDataset, samples: int) -> TensorDataset:
    """``data`` repeated whole until it holds at least ``samples`` (one epoch covers a run, so no
    run stalls at an epoch boundary)."""
    x, y = data.tensors
    reps = max(1, -(-samples // len(y)))
    return TensorDataset(x.repeat(reps, *([1] * (x.dim() - 1))), y.repeat(reps))


def accuracy(net: nn.Module, data: TensorDataset) -> float:
    """Share of ``data`` that ``net`` classifies right (eval mode, no gradients, 256 at a time)."""
    x, y = data.tensors
    net.eval()
    with torch.no_grad():
        pred = torch.cat([net(x[i:i + 256]).argmax(dim=1) for i in range(0, len(y), 256)])
    return float((pred == y).float().mean())
