"""Optimizer state of an FSDP2 model in a checkpoint: each rank writes its own shards.

Under FSDP2 an optimizer's state tensors are DTensors sharded like their parameters, so one
rank's ``state_dict()`` is not the whole state, and a blob of it could not be resumed on another
world size. Every state tensor therefore goes into the DCP state dict under its own key
(``optim_shard.<optimizer>.<param index>.<name>``), where DCP writes each rank's shards and
reads back any sharding of them; the rest of ``state_dict()`` (param groups, non-tensor state)
is the same on every rank and rides in the ``optim`` blob as for DDP.

NOTE: not torch's ``get_optimizer_state_dict``/``set_optimizer_state_dict``: to load into an
optimizer that has no state yet they run ``optimizer.step()`` with lr=0, which an adapter
counting steps on the optimizer (the Accelerate plugin) would count. The template a load fills
is built here from the checkpoint's metadata instead: a state tensor shaped like its parameter
takes the parameter's sharding (``zeros_like`` of the DTensor), any other (Adam's ``step``) is
a plain tensor.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PREFIX", "load_sharded_optimizers", "split_optimizer_states"]

PREFIX = "optim_shard."


def split_optimizer_states(optimizers: list[Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """(every state tensor under its DCP key, each ``state_dict()`` without its tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    rests: list[dict[str, Any]] = []
    for i, opt in enumerate(optimizers):
        full = opt.state_dict()
        state = {}
        for pid, entries in full["state"].items():
            state[pid] = {k: v for k, v in entries.items() if not torch.is_tensor(v)}
            tensors.update({f"{PREFIX}{i}.{pid}.{k}": v for k, v in entries.items() if torch.is_tensor(v)})
        rests.append({**full, "state": state})
    return tensors, rests


def load_sharded_optimizers(load: Any, metadata: dict[str, Any], optimizers: list[Any],
                            rests: list[dict[str, Any]]) -> None:
    """Fill ``optimizers`` from a checkpoint's shard keys (``metadata``: its DCP state-dict metadata),
    resharded to this run's parameters; ``load(state)`` is the writer's in-place DCP read."""
    from torch.distributed.tensor import DTensor

    params = [[p for g in opt.param_groups for p in g["params"]] for opt in optimizers]
    template: dict[str, torch.Tensor] = {}
    for key, meta in metadata.items():
        if not key.startswith(PREFIX):
            continue
        i, pid, _ = key[len(PREFIX):].split(".", 2)
        param, size, dtype = params[int(i)][int(pid)], tuple(meta.size), meta.properties.dtype
        if isinstance(param, DTensor) and size == tuple(param.shape):
            template[key] = torch.zeros_like(param, dtype=dtype)  # the parameter's sharding
        else:
            template[key] = torch.zeros(size, dtype=dtype, device=param.device)
    load(template)
    for i, (opt, rest) in enumerate(zip(optimizers, rests, strict=True)):
        state = {pid: dict(entries) for pid, entries in rest["state"].items()}
        for key, value in template.items():
            k, pid, name = key[len(PREFIX):].split(".", 2)
            if int(k) == i:
                state.setdefault(int(pid), {})[name] = value
        opt.load_state_dict({**rest, "state": state})
