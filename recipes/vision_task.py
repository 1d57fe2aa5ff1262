"""ResNet's data and model, shared by ``resnet_lightning.py`` and ``resnet_accelerate.py``.

- ``digits`` (default, offline): scikit-learn's bundled 8x8 digits, upsampled to 32x32, 1 channel.
- ``cifar10``: torchvision's CIFAR-10 in ``data_dir`` (``download=True`` fetches it once).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from hetero_strategy.workloads.digits import digits_datasets

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)
CHANNELS = {"digits": 1, "cifar10": 3}  # input channels per data set, known before anything loads
LR, MOMENTUM = 0.05, 0.9  # SGD for the global batch; both scripts' defaults


def vision_datasets(data: str = "digits", data_dir: str = "./data", download: bool = False
                    ) -> tuple[Dataset, Dataset]:
    """(train, test) of (image (CHANNELS[data], 32, 32), label) pairs."""
    if data == "digits":
        return digits_datasets(size=32)
    if data == "cifar10":
        import torchvision
        import torchvision.transforms as T

        norm = T.Normalize(CIFAR_MEAN, CIFAR_STD)
        train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm])
        try:
            train = torchvision.datasets.CIFAR10(data_dir, train=True, download=download, transform=train_tf)
            test = torchvision.datasets.CIFAR10(data_dir, train=False, download=download,
                                                transform=T.Compose([T.ToTensor(), norm]))
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
            raise SystemExit(f"CIFAR-10 is not in data_dir={data_dir!r} ({e}); pass download=True "
                             "(--data.download=true / --download) to fetch it once") from e
        return train, test
    raise ValueError(f"data={data!r} is invalid: choose 'digits' (offline) or 'cifar10'")


def forward_batch(model: torch.nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, logits, labels) of an (image, label) batch."""
    x, y = batch
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits, y), logits, y

