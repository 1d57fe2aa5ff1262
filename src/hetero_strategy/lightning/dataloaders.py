"""Lightning's evaluation loaders under hetero: sharded as Lightning's DDP would, keeping shuffle."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

__all__ = ["distributed_eval_loader", "lightning_is_shuffled"]


def lightning_is_shuffled(loader: DataLoader) -> bool:
    """The user's shuffle as Lightning records it (it also sees loaders Lightning re-instantiated)."""
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled

    return bool(_is_dataloader_shuffled(loader))


def distributed_eval_loader(loader: DataLoader, world_size: int, rank: int, stage: Any) -> DataLoader:
    """What Lightning's DDP does for evaluation loaders, keeping the user's shuffle setting."""
    if isinstance(loader.sampler, DistributedSampler) or isinstance(loader.dataset, IterableDataset):
        return loader
    from lightning.pytorch.utilities.data import _update_dataloader

    sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank,
                                 shuffle=lightning_is_shuffled(loader))
    return _update_dataloader(loader, sampler, mode=stage)
