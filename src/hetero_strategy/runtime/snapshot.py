"""What a checkpoint of :mod:`hetero_strategy.runtime.checkpoint` holds, and how it is read back.

Keys of the DCP state dict:

* ``model``: the module's tensors (replicated: DCP writes each once, spread over ranks);
* ``optim``: the optimizers' ``state_dict()``s as one opaque blob, written by rank 0; under
  FSDP2 without their tensors, which are ``optim_shard.*`` keys (runtime/sharded_optim.py).
  NOTE: not torch's ``get_state_dict``: it runs ``optimizer.step()`` with lr=0 to create empty
  state, and an adapter that wraps ``step`` (the Accelerate plugin) would count that as a step;
* ``hetero.run``: world size, steps, data position, schedule step, config (rank 0's);
* ``hetero.rank<r>`` / ``hetero.lost<r>``: rank r's runtime state, and the size of its residuals;
* ``hetero.optim<r>``: in hybrid mode, rank r's own optimizers (local phases keep them per rank),
  and ``model`` is the last sync's anchor, the same on every rank mid-period too (each rank's
  own tensors ride in its runtime state);
* ``hetero.rng<r>``: rank r's random number generators (torch, CUDA, numpy, Python), so dropout
  and augmentation draw after a resume what they would have drawn without the interruption;
* ``extra.<name>``: any other state (e.g. LR schedulers), rank 0's.

NOTE: a key several ranks write must hold the same value on each (DCP keeps one rank's copy,
whichever its planner picks). Blobs that may differ between ranks (in hybrid mode steps,
optimizer and schedulers are per rank) are therefore written by rank 0 alone, or per rank.

Blobs are ``torch.save`` bytes: DCP would otherwise flatten a nested dict into keys a load must
know in advance.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hetero_strategy.config import counted
from hetero_strategy.runtime.fsdp import fsdp_modules
from hetero_strategy.runtime.sharded_optim import split_optimizer_states

__all__ = ["RUN", "blob", "dropped_message", "hetero_snapshot", "module_of", "optimizers_of", "residual_size",
           "restore_rng", "run_record", "snapshot", "unblob"]

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
    module = module_of(model)
    model_state = module.state_dict()  # under FSDP2 DTensors: DCP writes each rank's shards
    state = {"model": model_state, **hetero_snapshot(runtime)}
    if fsdp_modules(module):  # sharded optimizer state: its tensors under keys of their own
        tensors, rests = split_optimizer_states(optimizers_of(optimizer))
        state.update(tensors)
        optim = blob(rests)
    else:
        optim = blob([o.state_dict() for o in optimizers_of(optimizer)])
    hybrid = getattr(runtime, "hybrid", None)
    if hybrid is not None:  # local phases: every rank's own optimizer, and the anchor as the model
        state["model"] = hybrid.anchor_state(model_state)
        state[f"hetero.optim{runtime.rank}"] = optim
    if runtime.rank == 0:
        state.update({"optim": optim, **{f"extra.{k}": blob(v.state_dict()) for k, v in stateful.items()}})
    return state


def hetero_snapshot(runtime: Any) -> dict[str, Any]:
    """This rank's hetero keys: its own state, residual size and RNGs, and rank 0's run record."""
    mine = runtime.state_dict()
    rank = runtime.rank
    state = {f"hetero.rank{rank}": blob(mine), f"hetero.lost{rank}": blob(residual_size(mine.get("hook") or {})),
             f"hetero.rng{rank}": blob(_rng_state())}
    if rank == 0:
        state[RUN] = blob(run_record(runtime.state, mine))
    return state


def run_record(state: Any, mine: dict[str, Any]) -> dict[str, Any]:
    """What any world size can resume from: steps, data position, schedule step, config (``state``:
    the runtime's :class:`~hetero_strategy.runtime.state.RuntimeState`, ``mine`` its state_dict)."""
    sampler, hybrid = state.parts["sampler"], state.parts["hybrid"]
    epoch, samples = sampler.position if sampler is not None else (0, 0)
    run = {"world_size": state.world_size, "steps": state.steps, "epoch": epoch, "samples": samples,
           "hook_step": (mine.get("hook") or {}).get("step"), "config": state.config.to_record(),
           "memory_caps": state.memory_caps,
           "memory_probe": None if state.memory_probe is None else [
               None if m is None else {"fixed_bytes": m.fixed_bytes, "per_sample_bytes": m.per_sample_bytes,
                                       "limit_bytes": m.limit_bytes} for m in state.memory_probe]}
    if hybrid is not None:  # the phase and sync count, the same on every rank
        run["hybrid"] = hybrid.shared_state_dict()
    return run


def _rng_state() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng(state: dict[str, Any]) -> None:
    """Put back :func:`_rng_state`'s generators (the CUDA one on this rank's current device)."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


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


def dropped_message(old_world: int, new_world: int, lost: list[dict[str, float]]) -> str:
    """What a resume under another world size drops: every old rank's residuals (``residual_size``)."""
    values, l1 = sum(x["values"] for x in lost), sum(x["l1"] for x in lost)
    return (f"hetero: checkpoint of {counted(old_world, 'rank')} resumed on {new_world}: batch shares are planned for the new "
            f"world and the error-feedback residuals of all {old_world} old ranks are dropped ({values} values, "
            f"L1 norm {l1:.6g})")
