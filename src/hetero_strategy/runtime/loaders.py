"""Rebuild a user's training DataLoader around hetero's batch sampler (plain PyTorch).

Both adapters call these: Lightning on the loader ``train_dataloader()`` returns, Accelerate on
the loader given to ``HeteroPlugin.prepare`` before Accelerate shards it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from hetero_strategy.balance import HeteroBatchSampler
from hetero_strategy.balance.costed import CostedBatchSampler
from hetero_strategy.config import ConfigError

__all__ = ["ClaimingLoader", "check_sample_cost", "claiming_loader", "hetero_train_loader", "is_shuffled", "probe_batch", "sample_costs",
           "train_loader_batch_size"]


def train_loader_batch_size(loader: DataLoader) -> int:
    """The user's per-rank mean batch B; refuse loaders hetero cannot split."""
    if isinstance(loader.dataset, IterableDataset):
        raise ConfigError(
            f"DataLoader.dataset={type(loader.dataset).__name__} is invalid for hetero training: an "
            "IterableDataset cannot be split into capacity-sized slices of one global batch; use a map-style "
            "Dataset (with __len__ and __getitem__)"
        )
    if loader.batch_size is None:
        raise ConfigError(
            f"DataLoader.batch_sampler={type(loader.batch_sampler).__name__} is invalid for hetero training: "
            "hetero replaces the batch sampler; pass DataLoader(dataset, batch_size=B, shuffle=...) instead"
        )
    sampler = loader.sampler
    plain_random = isinstance(sampler, RandomSampler) and not sampler.replacement \
        and sampler.num_samples == len(loader.dataset)
    if not (isinstance(sampler, SequentialSampler) or plain_random):
        # NOTE: hetero orders the samples itself (one process's shuffle or sequence); any other
        # sampler's choice of samples would be dropped silently
        raise ConfigError(
            f"DataLoader.sampler={type(sampler).__name__} is invalid for hetero training: hetero replaces the "
            "sampler with one process's order (shuffle=True or False). Pass shuffle=... instead, or select the "
            "samples with torch.utils.data.Subset(dataset, indices)"
        )
    return int(loader.batch_size)


def is_shuffled(loader: DataLoader) -> bool:
    """Whether the user asked for shuffling: ``shuffle=True`` shows as a RandomSampler."""
    sampler = getattr(loader.batch_sampler, "sampler", loader.sampler)
    return isinstance(sampler, RandomSampler) or bool(getattr(sampler, "shuffle", False))


class ClaimingLoader(DataLoader):
    """A DataLoader that calls ``on_batch()`` as each batch reaches its caller, for a framework with
    no batch-start event (Fabric): loaders fetch ahead, so the runtime's ``batch_start`` must run
    when the batch is handed out, not when the sampler yields its indices.

    Epochs: Fabric sets the sampler's epoch to the number of times *this process* iterated the
    loader, so a run resumed in epoch e would start again at epoch 0. At the first iteration the
    epochs are shifted by where the (restored) batch sampler stands, so they go on from e.
    """

    on_batch: Callable[[], None] | None = None
    epoch_offset: int | None = None  # set at the first iteration

    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        if isinstance(sampler, HeteroBatchSampler):
            if self.epoch_offset is None:  # the epoch the restored position lies in (0 on a fresh start)
                self.epoch_offset = max(sampler.position[0] - sampler.epoch, 0)
            sampler.set_epoch(sampler.epoch + self.epoch_offset)
        for batch in super().__iter__():
            if self.on_batch is not None:
                self.on_batch()
            yield batch


def claiming_loader(loader: DataLoader, on_batch: Callable[[], None]) -> ClaimingLoader:
    """``loader`` (its dataset, batch sampler and worker settings) as a :class:`ClaimingLoader`."""
    claiming = _rebuild(loader, cls=ClaimingLoader, batch_sampler=loader.batch_sampler)
    claiming.on_batch = on_batch
    return claiming


def _rebuild(loader: DataLoader, cls: type[DataLoader] = DataLoader, **overrides: Any) -> DataLoader:
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
    return cls(**kwargs)


def check_sample_cost(config: Any, accumulate: int) -> None:
    """Refuse what dealing by cost cannot do yet, before any work (a HeteroConfig and the window)."""
    if config.balance.sample_cost is None:
        return
    if accumulate > 1:
        # NOTE: the hook weights a window's summed gradient by its last micro-batch's share; dealt
        # shares change from micro-batch to micro-batch, so the sum would be mis-weighted.
        raise ConfigError(f"sample_cost={config.balance.sample_cost!r} is invalid with gradient accumulation "
                          f"({accumulate} micro-batches per step): use accumulate 1, or unset sample_cost")
    if config.calibration.calibrate:
        raise ConfigError(f"sample_cost={config.balance.sample_cost!r} is invalid with calibrate=True: online "
                          "calibration models time by sample count and cannot follow dealt batches yet; "
                          "set calibrate=False (the capacity split still sets each rank's share)")


def sample_costs(dataset: Any, attribute: str | Callable[[int], float]) -> list[float]:
    """One cost per sample (balance.sample_cost): ``dataset.<attribute>``, or ``attribute(i)`` for
    every index when it is a function; checked up front."""
    if callable(attribute):
        costs = []
        for i in range(len(dataset)):
            try:
                c = float(attribute(i))  # ints, numpy scalars, 0-d tensors
            except Exception as e:  # the user's function: say which sample
                raise ConfigError(f"sample_cost={attribute!r} is invalid: it raised {e!r} for sample {i}") from e
            if not math.isfinite(c) or c < 0:
                raise ConfigError(f"sample_cost={attribute!r} is invalid: it returned {c!r} for sample {i}; it "
                                  "must return a finite number >= 0 (e.g. the sample's token count)")
            costs.append(c)
        return costs
    values = getattr(dataset, attribute, None)
    if values is None:
        raise ConfigError(f"sample_cost={attribute!r} is invalid: the training dataset "
                          f"{type(dataset).__name__} has no attribute {attribute!r}; give it one cost per sample "
                          "(e.g. dataset.lengths = [len(t) for t in tokens]) or unset sample_cost")
    costs = [float(v) for v in values]
    if len(costs) != len(dataset) or any(not c >= 0 for c in costs):
        raise ConfigError(f"sample_cost={attribute!r} is invalid: dataset.{attribute} has {len(costs)} entries for "
                          f"{len(dataset)} samples (need one non-negative cost per sample)")
    return costs


def hetero_train_loader(loader: DataLoader, sizes: list[int], rank: int | None, seed: int,
                        shuffle: bool | None = None, sample_cost: str | Callable[[int], float] | None = None,
                        loss_normalization: str = "samples", caps: list[int] | None = None
                        ) -> tuple[DataLoader, HeteroBatchSampler]:
    """The training loader with capacity-sized slices of each global batch (order: the user's shuffle).

    ``rank`` None yields every rank's slice in turn, for a framework that shards batches itself
    (Accelerate's ``BatchSamplerShard`` hands batch i to rank i mod world size). With
    ``sample_cost`` (a dataset attribute) each global batch is dealt out by predicted time
    (``balance/costed.py``), each rank weighted by its samples or, for "tokens", its token count.
    """
    kwargs = dict(shuffle=is_shuffled(loader) if shuffle is None else shuffle, seed=seed, drop_last=loader.drop_last)
    costs = None if sample_cost is None else sample_costs(loader.dataset, sample_cost)
    units = costs if loss_normalization == "tokens" else None
    if units is not None and min(units) <= 0:
        raise ConfigError(f"sample_cost={sample_cost!r} is invalid with loss_normalization='tokens': a sample with "
                          "0 tokens adds nothing to the loss's denominator; drop empty samples from the dataset")
    if costs is None:
        sampler = HeteroBatchSampler(len(loader.dataset), sizes, rank, **kwargs)
    else:
        sampler = CostedBatchSampler(len(loader.dataset), sizes, rank, costs=costs, units=units, caps=caps, **kwargs)
    return _rebuild(loader, batch_sampler=sampler), sampler


def probe_batch(loader: DataLoader, batch: int) -> Any:
    """The dataset's first ``batch`` samples collated as the user's loader would (for the probe)."""
    n = min(batch, len(loader.dataset))
    return loader.collate_fn([loader.dataset[i] for i in range(n)])
