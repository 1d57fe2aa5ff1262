"""What a checkpoint of :mod:`hetero_strategy.runtime.checkpoint` holds, and how it is read back.

Keys of the DCP state dict:

* ``model``: the module's tensors (replicated: DCP writes each once, spread over ranks);
* ``optim``: the optimizers' ``state_dict()``s as one opaque blob (replicated, written once).
  NOTE: not torch's ``get_state_dict``: it runs ``optimizer.step()`` with lr=0 to create empty
  state, and an adapter that wraps ``step`` (the Accelerate plugin) would count that as a step;
* ``hetero.run``: world size, steps, data position, schedule step, config (replicated);
* ``hetero.rank<r>`` / ``hetero.lost<r>``: rank r's runtime state, and the size of its residuals;
* ``hetero.optim<r>``: in hybrid mode, rank r's own optimizers (local phases keep them per rank),
  and ``model`` is the last sync's anchor, the same on every rank mid-period too (each rank's
  own tensors ride in its runtime state);
* ``extra.<name>``: any other state (e.g. LR schedulers), replicated.

Blobs are ``torch.save`` bytes: DCP would otherwise flatten a nested dict into keys a load must
know in advance.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["RUN", "blob", "module_of", "optimizers_of", "residual_size", "snapshot", "unblob"]

RUN = "hetero.run"


def module_of(model: Any) -> torch.nn.Module:
    """The module under DDP (and torch.compile) wrappers: its keys carry no ``module.`` prefix."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def optimizers_of(optimizer: Any) -> list[Any]:
    if optimizer is None:
        return []
    return list(optimizer) if isinstance(optimizer, Sequence) else [optimizer]


def snapshot(runtime: Any, model: Any, optimizer: Any, stateful: dict[str, Any]) -> dict[str, Any]:
    """The state dict one rank hands to DCP (host copies are DCP's staging, right after)."""
    mine = runtime.state_dict()
    sampler = runtime.sampler
    epoch, samples = sampler.position if sampler is not None else (0, 0)
    run = {"world_size": runtime.world_size, "steps": runtime.steps, "epoch": epoch, "samples": samples,
           "hook_step": (mine.get("hook") or {}).get("step"), "config": runtime.config.to_record()}
    model_state = module_of(model).state_dict()
    optim = blob([o.state_dict() for o in optimizers_of(optimizer)])
    own_optim = {}
    hybrid = getattr(runtime, "hybrid", None)
    if hybrid is not None:  # local phases: every rank's own optimizer, and the anchor as the model
        model_state = hybrid.anchor_state(model_state)
        own_optim = {f"hetero.optim{runtime.rank}": optim}
        run["hybrid"] = hybrid.shared_state_dict()
    return {"model": model_state, "optim": optim, **own_optim,
            RUN: blob(run), f"hetero.rank{runtime.rank}": blob(mine),
            f"hetero.lost{runtime.rank}": blob(residual_size(mine.get("hook") or {})),
            **{f"extra.{k}": blob(v.state_dict()) for k, v in stateful.items()}}


def blob(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def unblob(data: bytes) -> Any:
    # NOTE: on the CPU: a restarted rank may sit on another device index (residuals move lazily)
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def residual_size(hook: dict) -> dict[str, float]:
    """How much error feedback a rank holds: residual values and their L1 norm (PowerSGD's errors too)."""
    tensors = [*(hook.get("residuals") or {}).values(), *((hook.get("powersgd") or {}).get("error_dict") or {}).values()]
    return {"values": sum(t.numel() for t in tensors), "l1": float(sum(t.abs().sum() for t in tensors))}
