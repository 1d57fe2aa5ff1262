"""The prepared training loader, wired to the runtime, and the start-up probe it is planned with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hetero_strategy.runtime import HeteroRuntime
from hetero_strategy.runtime.model_probe import LossFn, default_loss, module_measure

__all__ = ["HeteroDataLoader", "default_loss", "train_loader"]


def train_loader(accelerator: Any, runtime: HeteroRuntime, loader: Any, model: Any,
                 loss_fn: LossFn | None, accumulate: int, seed: int | None = None) -> HeteroDataLoader:
    """The user's training loader, planned by the runtime (probing ``model`` when nothing is configured)."""
    measure = None if model is None else _measure(accelerator, runtime, model, loss_fn)
    if runtime.config.balance.seed is not None:  # the user's seed wins over the framework's
        seed = runtime.config.balance.seed
    seed = 0 if seed is None else seed
    # NOTE: the rebuilt loader yields every rank's slice of a step in turn, and Accelerate's
    # BatchSamplerShard deals batch i to rank i mod num_processes: Accelerate keeps its own
    # sharding, device placement, end-of-epoch flag (for accumulate) and set_epoch.
    rebuilt = runtime.train_loader(loader, seed=seed, measure=measure, all_ranks=True,
                                   accumulate=accumulate)
    return HeteroDataLoader(accelerator.prepare(rebuilt), runtime)


def _measure(accelerator: Any, runtime: HeteroRuntime, model: Any, loss_fn: LossFn | None) -> Any:
    """The probe of the unwrapped model (its forward keeps Accelerate's autocast), batches on the device."""
    from accelerate.utils import send_to_device

    return module_measure(runtime, accelerator.unwrap_model(model), loss_fn=loss_fn,
                          to_device=lambda b: send_to_device(b, accelerator.device),
                          hint="pass loss_fn=lambda model, batch: ... to HeteroPlugin.prepare, or batch_sizes=/capacities=")


class HeteroDataLoader:
    """Accelerate's prepared loader, telling the runtime each time a batch reaches the user.

    Accelerate's ``DataLoaderShard`` fetches one batch ahead (to flag the epoch's end for
    ``accumulate``), so the batch sampler runs ahead of training; the runtime hands out the plan
    of the oldest batch nobody has claimed when this loader yields it. At the epoch's end it calls
    ``runtime.join()`` (mode="hybrid": local phases end each epoch on one model). Everything else
    (``len``, ``set_epoch``, ``dataset``, ``batch_sampler`` ...) is the prepared loader's.
    """

    def __init__(self, loader: Any, runtime: HeteroRuntime) -> None:
        self.loader = loader
        self.runtime = runtime
        self.before_batch: Callable[[], None] | None = None  # a due checkpoint, between two steps

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            if self.before_batch is not None:
                self.before_batch()
            self.runtime.batch_start()
            yield batch
        # NOTE: here the user's loop body of the epoch's last batch has run (its optimizer step
        # too): in mode="hybrid" this rank's data is over, so it joins the others' remaining syncs
        self.runtime.join()

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "runtime", "before_batch"):  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
