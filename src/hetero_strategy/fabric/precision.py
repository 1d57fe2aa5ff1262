"""Fabric's precision plugin for a hetero precision policy: each rank autocasts in its own dtype.

The strategy scales the loss (fp16 ranks only) in ``backward`` and gates the optimizer step on the
reduced gradient; the comm hook unscales each contribution before the reduction. So this plugin
only gives ``fabric.autocast()`` and the model's forward this rank's autocast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from lightning.fabric.plugins.precision import Precision
from typing_extensions import override

from hetero_strategy.precision.policy import policy_plugin

__all__ = ["HeteroFabricPrecision", "policy_precision"]


def policy_precision(policy: Any, precision: Any, runtime: Callable[[], Any]) -> Any:
    """The plugin the strategy runs with: a HeteroFabricPrecision under a precision policy
    (refusing a plugin of the user's beside it), else the user's (None: Fabric decides)."""
    return policy_plugin(policy, precision, "precision", lambda: HeteroFabricPrecision(runtime))


class HeteroFabricPrecision(Precision):
    """Per-rank autocast from the runtime (see :mod:`hetero_strategy.precision`)."""

    def __init__(self, runtime: Callable[[], Any]) -> None:
        self._runtime = runtime  # the strategy's HeteroRuntime, built once the environment is set up

    @override
    def forward_context(self) -> contextlib.AbstractContextManager:
        return self._runtime().autocast()
