"""The prepared training loader, wired to the runtime, and the start-up probe it is planned with."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from hetero_strategy.balance.probe import ProbeError, ProbeExchange, StepCost, probe_step_cost
from hetero_strategy.runtime import HeteroRuntime

__all__ = ["HeteroDataLoader", "default_loss", "train_loader"]

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def train_loader(accelerator: Any, runtime: HeteroRuntime, loader: Any, model: Any,
                 loss_fn: LossFn | None) -> HeteroDataLoader:
    """The user's training loader, planned by the runtime (probing ``model`` when nothing is configured)."""
    measure = None if model is None else lambda batches, exchange: _measure(accelerator, runtime, model, loss_fn,
                                                                            batches, exchange)
    seed = runtime.config.balance.seed if runtime.config.balance.seed is not None else 0
    # NOTE: the rebuilt loader yields every rank's slice of a step in turn, and Accelerate's
    # BatchSamplerShard deals batch i to rank i mod num_processes: Accelerate keeps its own
    # sharding, device placement, end-of-epoch flag (for accumulate) and set_epoch.
    rebuilt = runtime.train_loader(loader, seed=seed, measure=measure, all_ranks=True,
                                   accumulate=accelerator.gradient_accumulation_steps)
    return HeteroDataLoader(accelerator.prepare(rebuilt), runtime)


def _measure(accelerator: Any, runtime: HeteroRuntime, model: Any, loss_fn: LossFn | None,
             batches: list[tuple[Any, int]], exchange: ProbeExchange) -> StepCost | None:
    """Probe the unwrapped model (its forward keeps Accelerate's autocast), batches on the device."""
    from accelerate.utils import send_to_device

    module = accelerator.unwrap_model(model)
    on_device = [(send_to_device(b, accelerator.device), n) for b, n in batches]
    fn = loss_fn or default_loss
    try:
        with runtime.autocast():  # timed in the dtype this rank will train in
            return probe_step_cost(module, lambda b: fn(module, b), on_device, runtime.config.balance.probe_steps,
                                   exchange=exchange)
    except ProbeError as e:  # raised on every rank alike: equal shares, with the reason
        if loss_fn is not None:
            raise
        runtime.warn(f"hetero: {e}; pass loss_fn=lambda model, batch: ... to HeteroPlugin.prepare, "
                     "or batch_sizes=/capacities=")
        return None


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
