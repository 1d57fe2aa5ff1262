"""Whether an optimizer step goes ahead: this rank's precision and the non-finite rule.

Every decision here is taken from the *reduced* gradient, which is the same on every rank, so all
ranks decide alike without a collective (docs/design.md semantics 9 and 11):

* with ``precision_policy``, the coordinated loss scaler steps or skips, and fp16 ranks back off;
* without it, a non-finite step is dropped (``nonfinite="skip"``) or stops the job (``"stop"``).

When the framework scales the loss itself (Lightning's ``precision="16-mixed"``, Accelerate's
``mixed_precision="fp16"``), its GradScaler owns overflow handling and the adapter does not gate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from hetero_strategy.config import PrecisionConfig
from hetero_strategy.config.reliability import ReliabilityConfig
from hetero_strategy.precision import RankPrecision
from hetero_strategy.precision.scaler import CoordinatedScaler
from hetero_strategy.runtime.nonfinite import NonFiniteGuard

__all__ = ["StepGate"]


class StepGate:
    """One rank's autocast, loss scale and step decision."""

    def __init__(self, config: ReliabilityConfig, warn: Callable[[str], None]) -> None:
        self.precision: RankPrecision | None = None
        self.guard = NonFiniteGuard(config.nonfinite, warn)
        self._loss_scaled = False
        self._found: bool | None = None

    def setup_precision(self, config: PrecisionConfig, rank: int, world_size: int, device: Any, model: Any = None,
                        device_info: Any = None) -> RankPrecision:
        """This rank's dtype and loss scaler under ``precision_policy``; ``model``'s parameters stay fp32."""
        self.precision = RankPrecision.build(config, rank, world_size, device, device_info)
        if model is not None:
            self.precision.keep_fp32(model)
        return self.precision

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self.precision is None else self.precision.autocast()

    def scale_loss(self, loss: Any, hook_state: Any) -> Any:
        self._loss_scaled = True
        if self.precision is None:
            return loss
        if hook_state is not None:  # this backward's contribution is unscaled in the hook
            hook_state.set_loss_scale(self.precision.scaler.scale)
        return self.precision.scaler.scale_loss(loss)

    def check(self, params: Any) -> bool:
        """Decide now, from the reduced gradient, whether this step is dropped (before any clipping)."""
        self._found = CoordinatedScaler.found_inf(list(params))
        return self._found

    def drop_nonfinite(self, params: list[Any], step: int) -> bool:
        """Without a loss scaler: True (gradients cleared, so the optimizer's step changes nothing)
        when the reduced gradient is non-finite; raises under ``nonfinite="stop"``."""
        found = self._take_found(params)
        if found:
            self.guard.on_nonfinite(step, scaled=False)
            for p in params:
                p.grad = None
        return found

    def step(self, optimizer: Any, step: int, step_fn: Callable[[], Any] | None = None,
             before_step: Callable[[], Any] | None = None) -> bool:
        """Step unless the reduced gradient is non-finite (then every rank skips); True if stepped."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if self.precision is None:
            if self.drop_nonfinite(params, step):
                return False
            if before_step is not None:
                before_step()
            (step_fn or optimizer.step)()
            return True
        if not self._loss_scaled:
            # NOTE: raised on every rank alike (all run the same code), so no rank is left waiting
            raise RuntimeError("hetero: with precision_policy the loss must go through runtime.scale_loss(loss) "
                               "before backward (Accelerate: plugin.backward(loss)): fp16 ranks scale it there "
                               "and the comm hook unscales their gradients")
        self._loss_scaled = False
        found = self._take_found(params)
        # every rank alike; "stop" lets an fp16 overflow through to the scaler's back-off, and a
        # skip is the scaler's routine (it counts them), so it is not logged as a non-finite step
        if found and self.guard.action == "stop":
            self.guard.on_nonfinite(step, scaled=self.precision.scaler.enabled)
        return self.precision.scaler.step(optimizer, step_fn, before_step, found_inf=found)

    def _take_found(self, params: list[Any]) -> bool:
        found = self._found if self._found is not None else CoordinatedScaler.found_inf(params)
        self._found = None
        return found
