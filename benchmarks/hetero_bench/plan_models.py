"""The benchmarks' models as ``module:callable`` for ``hetero-strategy plan`` and ``profile --model``.

Each returns (module, example batch) with the shapes the benchmark trains on, so the planner
counts the FLOPs, and the profile times the step, of the very model that ``bench plan`` measures.
"""

from __future__ import annotations

import torch

__all__ = ["balance_resnet18", "balance_resnet18_l3", "compression_resnet18"]


def balance_resnet18() -> tuple[torch.nn.Module, torch.Tensor]:
    """``bench balance --model resnet18``: torchvision's stem, 1x32x32 digits, 10 classes."""
    from hetero_bench.balance_workload import bench_model

    return bench_model("resnet18"), torch.zeros(2, 1, 32, 32)


def balance_resnet18_l3() -> tuple[torch.nn.Module, torch.Tensor]:
    """``bench balance --model resnet18_l3``: the same without layer4."""
    from hetero_bench.balance_workload import bench_model

    return bench_model("resnet18_l3"), torch.zeros(2, 1, 32, 32)


def compression_resnet18() -> tuple[torch.nn.Module, torch.Tensor]:
    """``bench compression``'s step-time model: torchvision resnet18, 10 classes, 3x32x32."""
    from torchvision.models import resnet18

    return resnet18(num_classes=10), torch.zeros(2, 3, 32, 32)
