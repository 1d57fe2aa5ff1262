"""The start-up probe of a plain ``nn.Module``, for adapters whose framework has no training step of
its own to time (Accelerate, Fabric): the user's loss function, or :func:`default_loss`.

Example::

    measure = module_measure(runtime, model, to_device=lambda b: b, hint="pass loss_fn=...")
    loader = runtime.train_loader(loader, seed=0, measure=measure)   # the probe is collective
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hetero_strategy.balance.probe import ProbeError, ProbeExchange, StepCost, probe_step_cost

__all__ = ["LossFn", "default_loss", "module_measure"]

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def module_measure(runtime: Any, module: torch.nn.Module, *, to_device: Callable[[Any], Any],
                   loss_fn: LossFn | None = None, context: Callable[[], Any] | None = None,
                   hint: str = "pass a loss_fn, or batch_sizes=/capacities=") -> Callable[..., StepCost | None]:
    """The planner's ``measure``: ``loss_fn(module, batch)`` + backward timed on this rank.

    ``module`` is the bare model, not its DDP wrapper (the probe must not start DDP's exchange);
    ``to_device`` moves a probe batch where the model is; ``context`` is the forward's autocast
    (default: the runtime's, this rank's dtype). Without ``loss_fn``, a batch :func:`default_loss`
    cannot run on gives equal shares with a warning that ends with ``hint`` (raised on every rank
    alike); the user's own ``loss_fn`` failing is an error."""
    fn = loss_fn or default_loss

    def measure(batches: list[tuple[Any, int]], exchange: ProbeExchange) -> StepCost | None:
        on_device = [(to_device(b), n) for b, n in batches]
        try:
            with (context or runtime.autocast)():  # timed in the dtype this rank will train in
                return probe_step_cost(module, lambda b: fn(module, b), on_device,
                                       runtime.config.balance.probe_steps, exchange=exchange)
        except ProbeError as e:
            if loss_fn is not None:
                raise
            runtime.warn(f"hetero: {e}; {hint}")
            return None

    return measure


def default_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """A scalar to backpropagate for timing ``model`` on ``batch`` (the probe's default).

    A mapping is passed as keywords (Hugging Face style) and the model's own ``loss`` is used when
    it returns one; a tuple or list passes its first element (``(inputs, target)``), a tensor
    passes itself. Without a loss the mean of the first output stands in: it runs the same
    backward pass, and the probe only measures time. Pass ``loss_fn`` otherwise.
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
