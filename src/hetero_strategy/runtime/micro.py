"""Per-rank micro-batching: a share larger than the rank's memory cap runs as several passes.

``max_batch_sizes`` caps one forward/backward pass, not a rank's share of the global batch: the
shares follow capacity, and a rank whose share b_r exceeds its cap c_r runs it as ceil(b_r / c_r)
passes of near-equal size. Pass i's loss is weighted by n_i / b_r, so the gradient the rank
accumulates is that of its whole share's mean loss, and only the last pass synchronises (DDP's
``no_sync``, FSDP2's ``set_requires_gradient_sync(False)`` before it). The step stays exactly one
process's SGD on the global batch; ranks may run different numbers of passes, and every rank
still exchanges once per optimizer step (docs/design.md semantics 3).

Plain PyTorch: the adapters call :meth:`HeteroRuntime.micro_batches
<hetero_strategy.runtime.HeteroRuntime.micro_batches>`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch

from hetero_strategy.runtime.fsdp import fsdp_modules

__all__ = ["MicroBatch", "no_gradient_sync", "pass_sizes", "split_batch_tree"]


class MicroBatch(NamedTuple):
    """One pass of a rank's share: its slice and its loss weight n_i / b_r (the last pass synchronises)."""

    batch: Any
    weight: float


def pass_sizes(share: int, cap: int | None) -> list[int]:
    """``share`` samples as the fewest passes of at most ``cap``, sizes differing by at most one (larger first)."""
    if cap is None or share <= cap:
        return [share]
    count = -(-share // cap)
    base, extra = divmod(share, count)
    return [base + 1] * extra + [base] * (count - extra)


def split_batch_tree(batch: Any, sizes: list[int]) -> list[Any]:
    """``batch`` cut along dim 0 into ``sizes``: every tensor of length sum(sizes) in nested tuples,
    lists, named tuples and mappings is sliced; anything else (a scalar, a shorter tensor) is shared."""
    total = sum(sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    found = []

    def cut(node: Any, i: int) -> Any:
        if isinstance(node, torch.Tensor):
            if node.dim() and node.shape[0] == total:
                found.append(node)
                return node[starts[i]:starts[i] + sizes[i]]
            return node
        if isinstance(node, Mapping):
            return type(node)({k: cut(v, i) for k, v in node.items()})
        if isinstance(node, tuple) and hasattr(node, "_fields"):  # a named tuple
            return type(node)(*(cut(v, i) for v in node))
        if isinstance(node, (list, tuple)):
            if len(node) == total and not any(isinstance(v, (torch.Tensor, Mapping, list, tuple)) for v in node):
                found.append(node)
                return type(node)(node[starts[i]:starts[i] + sizes[i]])  # a list of per-sample items
            return type(node)(cut(v, i) for v in node)
        return node

    passes = [cut(batch, i) for i in range(len(sizes))]
    if len(sizes) > 1 and not found:  # every pass would run the whole batch: the share counted len(sizes) times
        raise ValueError(
            f"hetero: this rank's share of {total} samples runs as passes of {sizes} (its max_batch_sizes cap), "
            f"but nothing in the batch ({_shape(batch)}) has {total} items along dim 0. Give the loader's batch "
            "its samples along dim 0 (tensors, or lists of per-sample items), or raise the rank's cap to its share")
    return passes


def _shape(node: Any) -> str:
    if isinstance(node, torch.Tensor):
        return f"tensor{list(node.shape)}"
    if isinstance(node, Mapping):
        return "{" + ", ".join(f"{k!r}: {_shape(v)}" for k, v in node.items()) + "}"
    if isinstance(node, (list, tuple)):
        return type(node).__name__ + "(" + ", ".join(_shape(v) for v in list(node)[:4]) + (", ..." if len(node) > 4 else "") + ")"
    return type(node).__name__


@contextlib.contextmanager
def no_gradient_sync(model: Any) -> Iterator[None]:
    """Backward passes inside accumulate gradients locally: DDP's ``no_sync``, or FSDP2 without reduce-scatter."""
    fsdp = fsdp_modules(model)
    if fsdp:
        before = [_syncs(module) for module in fsdp]  # Accelerate's accumulate may have switched it off already
        for module in fsdp:  # kept gathered for the next pass: no all-gather the other ranks would not join
            module.set_requires_gradient_sync(False, recurse=False)
            module.set_reshard_after_backward(False, recurse=False)
        try:
            yield
        finally:
            for module, syncs in zip(fsdp, before):
                module.set_requires_gradient_sync(syncs, recurse=False)
                module.set_reshard_after_backward(True, recurse=False)
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:  # one process, no exchange
        yield


def _syncs(module: Any) -> bool:
    # NOTE: FSDP2 has a setter but no getter; its parameter group keeps the flag (torch 2.14)
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    return True if group is None else bool(getattr(group, "reduce_grads", True))


def micro_batches(batch: Any, share: int, cap: int | None, model: Any) -> Iterator[tuple[MicroBatch, Any]]:
    """(pass, the context its forward and backward run in) for each pass of this rank's share."""
    sizes = pass_sizes(share, cap)
    if len(sizes) == 1:
        yield MicroBatch(batch, 1.0), contextlib.nullcontext()
        return
    for i, chunk in enumerate(split_batch_tree(batch, sizes)):
        last = i == len(sizes) - 1
        yield MicroBatch(chunk, sizes[i] / share), (contextlib.nullcontext() if last else no_gradient_sync(model))
