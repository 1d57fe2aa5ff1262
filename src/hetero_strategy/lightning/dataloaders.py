"""Rebuild the user's DataLoaders with hetero's training sampler or an evaluation sampler."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from hetero_strategy.balance import HeteroBatchSampler
from hetero_strategy.config import ConfigError

__all__ = ["distributed_eval_loader", "hetero_train_loader", "probe_batch", "train_loader_batch_size"]


def train_loader_batch_size(loader: DataLoader) -> int:
    """The user's per-rank mean batch B; refuse loaders hetero cannot split."""
    if isinstance(loader.dataset, IterableDataset):
        raise ConfigError(
            f"train_dataloader.dataset={type(loader.dataset).__name__} is invalid for strategy='hetero': an "
            "IterableDataset cannot be split into capacity-sized slices of one global batch; use a map-style "
            "Dataset (with __len__ and __getitem__)"
        )
    if loader.batch_size is None:
        raise ConfigError(
            f"train_dataloader.batch_sampler={type(loader.batch_sampler).__name__} is invalid for strategy='hetero': "
            "hetero replaces the batch sampler; pass DataLoader(dataset, batch_size=B, shuffle=...) instead"
        )
    return int(loader.batch_size)


def _is_shuffled(loader: DataLoader) -> bool:
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled

    return bool(_is_dataloader_shuffled(loader))


def _rebuild(loader: DataLoader, **overrides: Any) -> DataLoader:
    kwargs = dict(
        dataset=loader.dataset,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    kwargs.update(overrides)
    return DataLoader(**kwargs)


def hetero_train_loader(loader: DataLoader, sizes: list[int], rank: int, seed: int) -> tuple[DataLoader, HeteroBatchSampler]:
    """The training loader with this rank's slice of each global batch (order: the user's shuffle)."""
    sampler = HeteroBatchSampler(
        len(loader.dataset), sizes, rank, shuffle=_is_shuffled(loader), seed=seed, drop_last=loader.drop_last
    )
    return _rebuild(loader, batch_sampler=sampler), sampler


def distributed_eval_loader(loader: DataLoader, world_size: int, rank: int, stage: Any) -> DataLoader:
    """What Lightning's DDP does for evaluation loaders, keeping the user's shuffle setting."""
    if isinstance(loader.sampler, DistributedSampler) or isinstance(loader.dataset, IterableDataset):
        return loader
    from lightning.pytorch.utilities.data import _update_dataloader

    sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=_is_shuffled(loader))
    return _update_dataloader(loader, sampler, mode=stage)


def probe_batch(loader: DataLoader, batch: int) -> Any:
    """The dataset's first ``batch`` samples collated as the user's loader would (for the probe)."""
    n = min(batch, len(loader.dataset))
    return loader.collate_fn([loader.dataset[i] for i in range(n)])
