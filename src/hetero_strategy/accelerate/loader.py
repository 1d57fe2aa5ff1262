"""The prepared training loader, wired to the runtime, and the probe's default step function."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from hetero_strategy.runtime import HeteroRuntime

__all__ = ["HeteroDataLoader", "default_loss"]


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


def default_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """A scalar to backpropagate for timing ``model`` on ``batch`` (the probe's default).

    A mapping is passed as keywords (Hugging Face style) and the model's own ``loss`` is used when
    it returns one; a tuple or list passes its first element (``(inputs, target)``), a tensor
    passes itself. Without a loss the mean of the first output stands in: it runs the same
    backward pass, and the probe only measures time. Pass ``loss_fn`` to prepare() otherwise.
    """
    if isinstance(batch, Mapping):
        out = model(**batch)
    elif isinstance(batch, (tuple, list)):
        out = model(batch[0])
    else:
        out = model(batch)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if loss is not None:
        return loss
    first = out if isinstance(out, torch.Tensor) else next(iter(out.values() if isinstance(out, Mapping) else out))
    return first.float().mean()
