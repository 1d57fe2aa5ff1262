"""Helpers of HeteroStrategy that read Lightning objects: the run's length, the DDP keywords."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from hetero_strategy.config import ConfigError

__all__ = ["check_ddp_kwargs", "dropping_nonfinite", "max_steps_of"]


def max_steps_of(trainer: Any) -> int | Any | None:
    """trainer.max_steps when set; else Lightning's estimate, read lazily (it needs the data)."""
    steps = getattr(trainer, "max_steps", None)
    if isinstance(steps, int) and steps > 0:
        return steps
    if trainer is not None and hasattr(trainer, "estimated_stepping_batches"):
        return lambda: trainer.estimated_stepping_batches
    return None


def check_ddp_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse keywords neither hetero nor DDP knows, here rather than deep inside DDP's constructor."""
    known = set(inspect.signature(DistributedDataParallel.__init__).parameters) | set(
        inspect.signature(DDPStrategy.__init__).parameters
    )
    for key, value in kwargs.items():
        if key not in known or key in ("self", "module", "kwargs"):
            raise ConfigError(f"{key}={value!r} is invalid: unknown option; HeteroStrategy takes the fields of "
                              "HeteroConfig plus DDPStrategy/DistributedDataParallel keywords")


def dropping_nonfinite(closure: Callable[[], Any], optimizer: Any, runtime: Any) -> Callable[[], Any]:
    """Lightning's closure (forward, backward, exchange), then the non-finite rule on the reduced
    gradient: a dropped step's gradients are cleared, so the optimizer's step changes nothing."""

    def run() -> Any:
        out = closure()
        runtime.drop_nonfinite(p for group in optimizer.param_groups for p in group["params"])
        return out

    return run
