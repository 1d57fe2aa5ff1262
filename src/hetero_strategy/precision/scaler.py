"""Loss scaling coordinated across ranks of mixed dtypes (docs/design.md semantics 9).

Only fp16 ranks scale their loss. Each rank's contribution is unscaled inside the comm hook,
before the reduction (the hook's weight becomes b_r / (G * scale_r)), so the reduced gradient is
in true units on every rank. A non-finite gradient on any rank makes the reduced gradient
non-finite on every rank (an all-reduce spreads inf/NaN; the compressed hooks mark the whole
bucket NaN), so one check of the reduced gradient per step, the same on every rank, decides to
skip the step everywhere: found-inf needs no extra collective and no host sync per bucket.

PyTorch's GradScaler cannot do this: it unscales after the reduction and checks found-inf per
rank, and a rank without fp16 would have to scale too.

Example::

    scaler = CoordinatedScaler(enabled=dtype == "fp16")
    hook_state.set_loss_scale(scaler.scale)       # before backward
    scaler.scale_loss(loss).backward()
    stepped = scaler.step(optimizer)              # skipped everywhere when any rank overflowed
"""

from __future__ import annotations

import collections
import warnings

import torch

__all__ = ["CoordinatedScaler"]


class CoordinatedScaler:
    """Dynamic loss scale of one rank; identical history on every fp16 rank of the job."""

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.enabled = enabled
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good_steps = 0
        self.skipped_steps = 0
        self.history: collections.deque[float] = collections.deque(maxlen=10_000)  # the scale after each step

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    @staticmethod
    def found_inf(params) -> bool:
        """Whether any reduced gradient holds a NaN/inf: one device reduction, one host read per step."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return False
        norms = torch._foreach_norm(grads)  # a NaN/inf entry makes its norm NaN/inf
        return not bool(torch.isfinite(torch.stack(norms)).all())

    def step(self, optimizer: torch.optim.Optimizer, step_fn=None, before_step=None,
             found_inf: bool | None = None) -> bool:
        """Step ``optimizer`` (or call ``step_fn``) unless the reduced gradient is non-finite; update
        the scale. True if stepped.

        Every rank reaches the same decision: the gradients it checks are the reduction's result.
        ``before_step`` (e.g. gradient clipping) runs only when the step goes ahead: checked after
        clipping by value, an inf would look finite. ``found_inf`` is a decision already taken.
        """
        params = [p for group in optimizer.param_groups for p in group["params"]]
        skip = self.found_inf(params) if found_inf is None else found_inf
        if not skip and before_step is not None:
            before_step()
        if skip:
            self.skipped_steps += 1
            for p in params:  # a skipped step leaves nothing behind for the next one
                p.grad = None
        else:
            (step_fn or optimizer.step)()
        self.update(skip)
        return not skip

    def update(self, found_inf: bool) -> None:
        """Back off after an overflow; grow after ``growth_interval`` clean steps (fp16 ranks only)."""
        if self.enabled:
            if found_inf:
                self.scale *= self.backoff_factor
                self.good_steps = 0
            else:
                self.good_steps += 1
                if self.good_steps == self.growth_interval:
                    self.scale *= self.growth_factor
                    self.good_steps = 0
        self.history.append(self.scale)

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps,
                "enabled": self.enabled}

    def load_state_dict(self, state: dict) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if bool(state.get("enabled", self.enabled)) != self.enabled:
            # NOTE: this rank's dtype changed since the checkpoint (policy edited, ranks moved to other
            # devices): another dtype's scale would unscale a loss that was never scaled
            warnings.warn(f"loss scaler: the checkpoint's scaler was {'on' if state.get('enabled') else 'off'} "
                          f"but this rank's is {'on' if self.enabled else 'off'}; its scale starts fresh", stacklevel=2)
            return
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
