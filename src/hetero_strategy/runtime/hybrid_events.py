"""The hybrid-mode events of :class:`~hetero_strategy.runtime.HeteroRuntime` (issue 14).

A bare-DDP loop in ``mode="hybrid"``::

    runtime = HeteroRuntime(HeteroConfig.from_flat(mode="hybrid"), rank, world_size)
    runtime.register_hook(ddp)                       # also sets up the local-step controller
    for x, y in batches:                             # each rank at its own pace in local phases (one epoch)
        with runtime.local_step(ddp):                # no_sync in a local phase
            loss_fn(ddp(x), y).backward()
        runtime.before_optimizer_step(opt)           # local clipping
        opt.step(); opt.zero_grad()
        runtime.step_end(samples=len(x))             # may end the period: the weighted sync
    runtime.join()                                   # data over: wait for the others' last syncs
    runtime.evaluated(validate(ddp))                 # every rank, same model: the phase schedule

In ``mode="sync"`` every method here is a no-op and :attr:`synced` is always True.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hetero_strategy.config import ConfigError
from hetero_strategy.dist import all_gather_floats

__all__ = ["HybridEvents"]


class HybridEvents:
    """Mixin of HeteroRuntime: needs ``hybrid`` (a HybridTraining or None) and ``steps``."""

    def local_step(self, ddp_model: Any) -> contextlib.AbstractContextManager:
        """``with runtime.local_step(ddp): loss.backward()``: no gradient exchange in a local phase."""
        return contextlib.nullcontext() if self.hybrid is None else self.hybrid.local_step(ddp_model)

    def before_optimizer_step(self, optimizer: Any) -> None:
        """Just before ``optimizer.step()``: local gradient clipping in a local phase."""
        if self.hybrid is not None:
            self.hybrid.before_optimizer_step(optimizer)

    def check_local_clipping(self, optimizers: Any, loss_scaled: bool) -> None:
        """Once the optimizers exist: refuse local clipping where the gradients are still scaled
        when it runs (``loss_scaled``: fp16 loss scaling; an optimizer that unscales inside its
        own step, as the fused ones do, leaves them scaled until then).

        Collective in hybrid mode with ``local_clip_norm`` set: every rank raises if any rank
        must, so a rank whose precision differs (per-machine settings) does not leave the others
        hanging at their next collective.
        """
        norm = None if self.hybrid is None else self.config.hybrid.local_clip_norm
        if norm is None:
            return
        # the flag torch's GradScaler reads: the optimizer unscales inside its own step
        fused = [type(o).__name__ for o in optimizers if getattr(o, "_step_supports_amp_scaling", False)]
        mine = 1.0 if loss_scaled and fused else 0.0
        ranks = [r for r, (flag,) in enumerate(all_gather_floats([mine])) if flag]
        if ranks:
            name = f"{fused[0]}(fused=True)" if mine else "a fused optimizer"
            raise ConfigError(f"local_clip_norm={norm!r} is invalid with {name} under fp16 mixed "
                              f"precision (on rank(s) {ranks}): the optimizer unscales the gradients inside its "
                              "step, so the local clipping would act on scaled gradients; pass "
                              "local_clip_norm=None, or an optimizer without fused=True")

    def join(self) -> None:
        """At the end of this rank's data (each epoch), before evaluating: in a local phase the ranks
        took unequal numbers of steps, so one that ran out takes part in the others' remaining
        syncs with no steps until every rank called it (collective); then all hold the same model."""
        if self.hybrid is not None:
            self.hybrid.join()

    def evaluated(self, val_loss: float) -> bool:
        """Every rank, at each evaluation (right after a sync): the phase schedule; True on a switch."""
        return False if self.hybrid is None else self.hybrid.evaluated(val_loss)

    @property
    def synced(self) -> bool:
        """Every rank holds the same model now (always, outside local phases): where to evaluate or save."""
        return self.hybrid is None or self.hybrid.synced

    def metrics_point(self, step: int, every: int) -> bool:
        """Whether every rank gathers :meth:`metrics` (an all-gather) after this optimizer step.

        ``step`` is the framework's step counter. In hybrid mode the ranks' step counts differ in
        local phases, so a per-step collective would deadlock: the metrics are gathered only at
        synced points, counted alike on every rank (:meth:`checkpoint_step`), every ``every`` of them.
        """
        if self.hybrid is None:
            return self.metrics_due(step, every)
        return self.hybrid.synced and self.metrics_due(self.checkpoint_step(), every)

    def require_synced(self, what: str) -> None:
        """Refuse a collective or a save (``what``) where the ranks' models and step counts differ."""
        if not self.synced:
            raise RuntimeError(f"hetero: {what} inside a local-SGD period (mode='hybrid'): the ranks' models and "
                               "step counts differ here, and a collective would deadlock; do it where runtime.synced "
                               "is True (after a sync, after join(), at an epoch's end)")

    def checkpoint_step(self) -> int:
        """The step a checkpoint is scheduled and named by, the same on every rank: in hybrid mode
        the points where :attr:`synced` was True."""
        return self.steps if self.hybrid is None else self.hybrid.points
