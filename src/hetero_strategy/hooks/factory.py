"""Choose the comm hook and its state from the configuration.

Example::

    state, hook = build_comm_hook(HeteroConfig.from_flat(compression="topk"))
    ddp_model.register_comm_hook(state, hook)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import COMPRESSION_METHODS, CompressionConfig, HeteroConfig
from hetero_strategy.dist.exit_guard import note_backward_context
from hetero_strategy.hooks.auto_state import AutoState, auto_hook
from hetero_strategy.hooks.baselines import (
    CastState,
    PowerSGDBaselineState,
    cast_hook,
    powersgd_weighted_hook,
)
from hetero_strategy.hooks.compressed import CompressedState
from hetero_strategy.hooks.compressed_hooks import onebit_hook, topk_hook
from hetero_strategy.hooks.tiers import exchange_codec
from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

__all__ = ["build_comm_hook"]

MaxSteps = int | Callable[[], Any] | None
_Builder = Callable[[CompressionConfig, Any, MaxSteps], tuple[WeightedReduceState, Callable]]

_BUILDERS: dict[str, _Builder] = {
    "none": lambda cfg, pg, steps: (WeightedReduceState(pg, overlap=cfg.overlap_comm), weighted_allreduce_hook),
    "topk": lambda cfg, pg, steps: (CompressedState(cfg, pg, max_steps=steps), topk_hook),
    "topk_allreduce": lambda cfg, pg, steps: (CompressedState(cfg, pg, max_steps=steps), topk_hook),
    "tiered": lambda cfg, pg, steps: _tiered(CompressedState(cfg, pg, max_steps=steps), cfg, pg),
    "onebit": lambda cfg, pg, steps: (CompressedState(cfg, pg, max_steps=steps), onebit_hook),
    "fp16": lambda cfg, pg, steps: (CastState(pg, dtype=torch.float16), cast_hook),
    "bf16": lambda cfg, pg, steps: (CastState(pg, dtype=torch.bfloat16), cast_hook),
    # PowerSGD needs >= 2 dense iterations (DDP's bucket rebuild), as upstream enforces
    "powersgd": lambda cfg, pg, steps: (
        PowerSGDBaselineState(pg, rank=cfg.powersgd_rank, start_iter=max(2, cfg.dense_warmup_steps)),
        powersgd_weighted_hook,
    ),
}


def _auto(cfg: CompressionConfig, pg: Any, steps: MaxSteps, model: Any, announce: Any) -> tuple[AutoState, Callable]:
    """compression="auto": measure, decide, and build the decided method's state (collective)."""
    def builder(derived: CompressionConfig) -> tuple[WeightedReduceState, Callable]:
        return _BUILDERS[derived.method](derived, pg, steps)

    return AutoState(cfg, pg, model=model, builder=builder, announce=announce), auto_hook


assert set(_BUILDERS) | {"auto"} == set(COMPRESSION_METHODS), "every configured method needs a builder"


def _tiered(state: CompressedState, cfg: CompressionConfig, pg: Any) -> tuple[WeightedReduceState, Callable]:
    """The hook of the exchange's codec: its slowest tier's (``tier_overrides.<tier>.codec``).

    The state was built first because it resolves and gathers the tiers (collective); every rank
    then takes the same codec. Codecs outside the Top-K family run torch's or the cast hooks."""
    if state.codec in ("topk", "topk_allreduce", "dense"):
        return state, topk_hook
    if state.codec == "onebit":
        return state, onebit_hook
    if state.hier is not None:
        raise ValueError(f"tier_overrides codec={state.codec!r} is invalid with hierarchical=True: the leaders' "
                         "exchange runs Top-K codecs only (topk, topk_allreduce, onebit, dense); "
                         "choose one of those for the slowest tier, or hierarchical=False")
    policy = exchange_codec(cfg.method, state.tiers, state.policies)[1]
    if state.codec == "powersgd":  # upstream needs >= 2 dense iterations (DDP's bucket rebuild)
        return PowerSGDBaselineState(pg, rank=policy.rank, start_iter=max(2, cfg.dense_warmup_steps)), \
            powersgd_weighted_hook
    return CastState(pg, dtype=torch.float16 if state.codec == "fp16" else torch.bfloat16), cast_hook


def build_comm_hook(
    config: HeteroConfig, process_group: dist.ProcessGroup | None = None, max_steps: MaxSteps = None,
    *, model: Any = None, announce: Callable[[str], None] | None = None,
) -> tuple[Any, Callable]:
    """(state, hook) for ``ddp.register_comm_hook``.

    ``max_steps`` is the run's length, the period of the density schedule when
    ``density_period`` is None: an int, or a callable read at the first compressed step (for a
    length known only once the data is set up). Collective for ``tiered`` (the ranks exchange
    their tiers) and ``auto`` (which measures): call it on every rank. ``auto`` needs ``model``
    (the DDP model: its parameter shapes and bucket cap) and says its decision to ``announce``
    on rank 0.
    """
    cfg = config.compression
    if cfg.method == "auto":
        state, hook = _auto(cfg, process_group, max_steps, model, announce)
    else:
        state, hook = _BUILDERS[cfg.method](cfg, process_group, max_steps)
    return state, _noting_backward_context(hook)


def _noting_backward_context(hook: Callable) -> Callable:
    """``hook`` keeping, first, the context its backward stashed: the process then waits at exit
    until gloo has let go of it (dist/exit_guard.py: otherwise an abort at exit, torch 2.14)."""

    @functools.wraps(hook)  # NOTE: DDP reads the name and the annotations
    def noting(state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
        note_backward_context()
        return hook(state, bucket)

    return noting
