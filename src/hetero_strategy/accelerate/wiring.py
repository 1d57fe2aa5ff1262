"""Small pieces HeteroPlugin hangs on Accelerate's objects: its custom state for ``save_state``,
and the wrapper around the DDP model's forward."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from hetero_strategy.runtime import HeteroRuntime

__all__ = ["SaveStateHook", "in_phase"]


class SaveStateHook:
    """``accelerator.save_state`` writes custom state from the main process only; this object's
    state_dict gathers every rank's part first (save_state runs on every rank), and each rank
    takes its own part back in ``load_state``."""

    def __init__(self, runtime: HeteroRuntime, optimizers: list[Any]) -> None:
        self.runtime = runtime
        self.optimizers = optimizers  # the inner ones: in hybrid mode each rank's own state rides along

    def state_dict(self) -> dict[str, Any]:
        with self.runtime.phase("checkpoint"):
            return self.runtime.gathered_state_dict([o.state_dict() for o in self.optimizers])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.runtime.load_gathered_state_dict(state)
        own = self.runtime.own_optimizer_states(state)
        # NOTE: load_state restores custom objects after the optimizers: this rank's own replaces rank 0's
        for opt, saved in zip(self.optimizers, own or [], strict=False):
            opt.load_state_dict(saved)


def in_phase(runtime: HeteroRuntime, where: str, method: Callable[..., Any], ddp: Any = None) -> Callable[..., Any]:
    """The bound ``method`` inside ``runtime.phase(where)``: a collective failing in it raises StallError.

    With ``ddp`` (mode="hybrid") a forward that records gradients is a local step's: under
    ``runtime.local_step(ddp)``, i.e. ``no_sync`` in a local phase. DDP decides in its forward
    whether the backward exchanges gradients, so the user's ``backward`` needs no wrapper.
    """
    # NOTE: weakly: the wrapper lives on the DDP object, and a cycle back to it would keep DDP (and
    # its gloo work) alive until interpreter shutdown, whose release there aborts the process
    ref = weakref.WeakMethod(method)
    ddp_ref = None if ddp is None else weakref.ref(ddp)

    def run(*args: Any, **kwargs: Any) -> Any:
        with runtime.phase(where):
            if ddp_ref is None or not torch.is_grad_enabled():  # evaluation is no local step
                return ref()(*args, **kwargs)
            with runtime.local_step(ddp_ref()):
                return ref()(*args, **kwargs)

    return run
