"""torchvision ResNets for small (32x32) images such as upsampled digits or CIFAR, one per stem.

The same 32x32 input meets two stems, which make two different models (FLOPs differ by 16x):

* :func:`resnet_cifar_stem` — a 3x3/1 stem and no max-pool, as the CIFAR ResNets have: layer1
  sees the full 32x32 image. The recipes' model (accurate; costly on CPU).
* :func:`resnet18_imagenet_stem` — torchvision's own 7x7/2 stem and max-pool: layer1 sees 8x8.
  The demo's and ``bench balance``'s model: cheap enough for several runs on CPU ranks.

Both take the weights from ``seed`` (every rank builds the same model). Plain PyTorch.

Example::

    net = resnet_cifar_stem("resnet18", in_channels=1)      # digits; in_channels=3 for CIFAR-10
    net = resnet18_imagenet_stem(without_layer4=True)       # 2.8 M parameters instead of 11.2 M
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["resnet18_imagenet_stem", "resnet_cifar_stem"]


def resnet_cifar_stem(arch: str = "resnet18", in_channels: int = 1, num_classes: int = 10, seed: int = 0) -> nn.Module:
    """A torchvision ResNet (resnet18/34/50 ...) with a 3x3/1 stem and no max-pool, for 32x32 input."""
    import torchvision

    torch.manual_seed(seed)
    net = getattr(torchvision.models, arch)(num_classes=num_classes)
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


def resnet18_imagenet_stem(without_layer4: bool = False, in_channels: int = 1, num_classes: int = 10,
                           seed: int = 0) -> nn.Module:
    """torchvision ResNet-18 with its own stem (7x7/2 + max-pool), here on 32x32 input.

    NOTE: the CIFAR-style stem costs 16x the FLOPs at 32x32; this is the model the anchor of the
    balance benchmark (0.33 s per step at batch 128 on one core) was measured with.
    ``without_layer4``: at 32x32 input layer4 runs on 1x1 maps, so it holds 75% of the parameters
    (8.4 of 11.2 M) but little of the compute. Its 2.8 M-parameter gradient makes a 100 Mbit link
    cost about 1 s a step instead of 3.6 s, so a 4-rank mixed-link run fits in minutes.
    """
    import torchvision

    torch.manual_seed(seed)
    net = torchvision.models.resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if without_layer4:
        net.layer4 = nn.Identity()
        net.fc = nn.Linear(256, num_classes)
    return net
