"""Lightning's precision plugin for a hetero precision policy: forwards to the runtime.

The strategy installs it when ``precision_policy`` is set. Each rank autocasts in its own dtype;
only fp16 ranks scale the loss; the comm hook unscales each contribution before the reduction;
the optimizer steps unless the reduced gradient is non-finite, on every rank alike. Gradient
clipping (``Trainer(gradient_clip_val=...)``) sees true-unit gradients: they arrive unscaled.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.plugins.precision import Precision
from typing_extensions import override

from hetero_strategy.config import ConfigError
from hetero_strategy.precision.policy import policy_plugin as chosen_plugin

__all__ = ["HeteroPrecision", "check_trainer_precision", "policy_plugin"]


def policy_plugin(policy: Any, precision_plugin: Any, runtime: Callable[[], Any]) -> Any:
    """The precision plugin HeteroStrategy runs with: a HeteroPrecision under a precision policy
    (refusing a plugin of the user's beside it), else the user's (None: Lightning decides)."""
    return chosen_plugin(policy, precision_plugin, "precision_plugin", lambda: HeteroPrecision(runtime))


def check_trainer_precision(trainer: Any, policy: Any) -> None:
    """Refuse ``Trainer(precision=...)`` beside a precision policy."""
    flag = trainer._accelerator_connector._precision_flag
    if policy is not None and flag != "32-true":
        # NOTE: Lightning would silently ignore Trainer(precision=...) beside our plugin
        raise ConfigError(f"Trainer(precision={flag!r}) conflicts with precision_policy={policy!r}: the policy picks "
                          "each rank's dtype; drop Trainer's precision (or drop precision_policy to let Lightning "
                          "decide)")


class HeteroPrecision(Precision):
    """Per-rank autocast and coordinated loss scaling (see :mod:`hetero_strategy.precision`)."""

    precision = "hetero"

    def __init__(self, runtime: Callable[[], Any]) -> None:
        self._runtime = runtime  # the strategy's HeteroRuntime, built once the environment is set up

    @override
    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        with self._runtime().autocast():
            yield

    @override
    def pre_backward(self, tensor: Any, module: Any) -> Any:
        return super().pre_backward(self._runtime().scale_loss(tensor), module)

    @override
    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        closure_result = closure()  # forward, backward, and the hook's reduction
        if closure_result is None and getattr(model, "automatic_optimization", True):
            return closure_result  # training_step returned None: Lightning skipped backward
        # on_before_optimizer_step and gradient clipping run only when the step goes ahead: the
        # overflow check comes first, since clipping by value would make an inf look finite
        self._runtime().optimizer_step(optimizer, lambda: optimizer.step(**kwargs),
                                       before_step=lambda: self._after_closure(model, optimizer))
        return closure_result
