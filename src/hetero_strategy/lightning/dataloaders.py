"""Lightning's loaders under hetero: who places the samplers, the training loader the runtime
splits, and evaluation loaders sharded as Lightning's DDP would, keeping shuffle."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

__all__ = ["LoaderPlacement", "distributed_eval_loader", "lightning_is_shuffled", "take_over_samplers"]


class LoaderPlacement:
    """Which loader each stage of a run gets; HeteroStrategy holds one.

    ``setup`` takes sampler placement over from Lightning (:func:`take_over_samplers`) and keeps
    the user's ``use_distributed_sampler``; ``place`` gives training the runtime's capacity-sized
    loader, validation and test Lightning's DistributedSampler, and predict Lightning's own.
    """

    def __init__(self) -> None:
        self.use_distributed_sampler = True

    def setup(self, trainer: Any) -> None:
        self.use_distributed_sampler = take_over_samplers(trainer)

    def place(self, loader: DataLoader, trainer: Any, runtime: Any, *, measure: Callable[..., Any],
              seed: int | None, world_size: int, rank: int) -> DataLoader:
        """The loader ``trainer``'s current stage runs; ``measure`` is the start-up probe of the model."""
        from lightning.pytorch.trainer.states import RunningStage

        stage = trainer.state.stage
        if stage == RunningStage.TRAINING:
            seed = seed if seed is not None else int(os.environ.get("PL_GLOBAL_SEED", "0"))
            return runtime.train_loader(loader, seed=seed, measure=measure, shuffle=lightning_is_shuffled(loader),
                                        accumulate=trainer.accumulate_grad_batches)
        if self.use_distributed_sampler and stage != RunningStage.PREDICTING:  # Lightning's own
            return distributed_eval_loader(loader, world_size, rank, stage)
        return loader


def take_over_samplers(trainer: Any) -> bool:
    """Switch Lightning's sampler injection off where hetero places the samplers; returns the
    user's ``use_distributed_sampler``.

    Lightning forces shuffling of training data when it injects its DistributedSampler, and the
    user's ``shuffle`` is lost by then, so hetero places the samplers itself (process_dataloader),
    following the user's DataLoader. ``trainer.predict()`` has no training data: there Lightning's
    own (unrepeated, index-tracking) predict sampler stays on.
    """
    from lightning.pytorch.trainer.states import TrainerFn

    connector = trainer._accelerator_connector
    # NOTE: read at this trainer's first run: a later test() or predict() on the same trainer would
    # find the flag switched off by the run before
    if not hasattr(connector, "_hetero_distributed_sampler"):
        connector._hetero_distributed_sampler = connector.use_distributed_sampler
    user = connector._hetero_distributed_sampler
    connector.use_distributed_sampler = user and trainer.state.fn == TrainerFn.PREDICTING
    return user


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
