"""Where a process group's collectives run."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["device_for"]


def device_for(process_group: dist.ProcessGroup | None) -> torch.device:
    """This rank's CUDA device on NCCL (which takes CUDA tensors only), else the CPU.

    Example::

        t = torch.tensor([x], device=device_for(group))
    """
    if dist.get_backend(process_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
