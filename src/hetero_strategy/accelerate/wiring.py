"""Small pieces HeteroPlugin hangs on Accelerate's objects: its custom state for ``save_state``,
the wrapper around the DDP model's forward, and the hooks on the prepared optimizers and schedulers."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from hetero_strategy.precision.scaler import CoordinatedScaler
from hetero_strategy.runtime import HeteroRuntime

__all__ = ["SaveStateHook", "checkpointed_extras", "in_phase", "state_init_step", "wire_steps"]


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


def wire_steps(prepared: list[Any], runtime: HeteroRuntime, after_step: Callable[[], None], gates: bool) -> list[Any]:
    """Hook the runtime into the prepared optimizers and schedulers; returns the inner optimizers.

    ``after_step`` runs once per optimizer step (skipped steps included); with ``gates`` hetero,
    not Accelerate's GradScaler, decides whether a step goes ahead.
    """
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler

    optimizers = [o for o in prepared if isinstance(o, AcceleratedOptimizer)]
    inners = [o.optimizer for o in optimizers]
    if optimizers:
        # The inner optimizer steps only when Accelerate syncs gradients: once per optimizer
        # step, after accumulation, and never on a step GradScaler skipped.
        optimizers[0].optimizer.register_step_post_hook(lambda opt, *_: None if state_init_step(opt) else after_step())
    if runtime.hybrid is not None:  # local clipping, and the optimizers the phase change aligns
        for inner in inners:
            inner.register_step_pre_hook(lambda opt, *_: runtime.before_optimizer_step(opt))
    if gates:
        for accelerated in optimizers:  # every optimizer skips alike when any rank overflowed
            _gate_step(accelerated, runtime, after_step, counts=accelerated is optimizers[0])
    for scheduler in (o for o in prepared if isinstance(o, AcceleratedScheduler)):
        # NOTE: Accelerate steps the schedule num_processes times per optimizer step (its batch
        # is B per process). hetero keeps the one-process run with batch G, which steps once.
        scheduler.split_batches = True
    return inners


def state_init_step(optimizer: Any) -> bool:
    """Whether this step is torch's state initialisation, not training: ``get_optimizer_state_dict``
    (which Accelerate's FSDP2 ``save_state``/``load_state`` call) steps an optimizer that has no
    state with every gradient zero and every lr set to 0. Not counted, gated or checked: hetero
    would count a step no batch made, and refuse its unweighted loss."""
    if optimizer.state or any(g.get("lr", 0) != 0 for g in optimizer.param_groups):
        return False
    # NOTE: the local shard of a DTensor gradient: bool() of a sharded one would be a collective
    grads = [getattr(p.grad, "_local_tensor", p.grad) for g in optimizer.param_groups for p in g["params"]]
    return all(grad is None or not grad.any() for grad in grads)


def _gate_step(accelerated: Any, runtime: HeteroRuntime, after_step: Callable[[], None], counts: bool) -> None:
    inner = accelerated.optimizer
    real = inner.step  # NOTE: the bound step runs the post hook; a skipped step does not

    def step(*args: Any, **kwargs: Any) -> None:
        if state_init_step(inner):
            return real(*args, **kwargs)
        if counts:  # the first optimizer owns the scale update and the step count
            stepped = runtime.optimizer_step(inner, lambda: real(*args, **kwargs))
        else:  # the others follow the same reduced-gradient check, without moving the scale
            stepped = not CoordinatedScaler.found_inf([p for g in inner.param_groups for p in g["params"]])
            if stepped:
                real(*args, **kwargs)
        accelerated._is_overflow = not stepped  # AcceleratedScheduler then holds the schedule too
        if not stepped and counts:
            after_step()  # skipped on every rank: the step still ended

    inner.step = step


def checkpointed_extras(accelerator: Any, prepared: list[Any]) -> dict[str, Any]:
    """What hetero's own checkpoints hold beside model and optimizers: the prepared schedulers, and
    the GradScaler of Accelerate's fp16 mixed precision."""
    from accelerate.scheduler import AcceleratedScheduler

    schedulers = [o.scheduler for o in prepared if isinstance(o, AcceleratedScheduler)]
    stateful = {f"scheduler{i}": s for i, s in enumerate(schedulers)}
    if getattr(accelerator, "scaler", None) is not None:
        stateful["grad_scaler"] = accelerator.scaler
    return stateful
