"""The checkpointable state of one rank: the runtime's parts, in and out, per rank or gathered.

:class:`~hetero_strategy.runtime.HeteroRuntime` holds one :class:`RuntimeState` and builds its
parts over the run (the sampler with the training loader, the hook state with the DDP model, the
loss scaler with the precision). A checkpoint may come before a part exists: what it holds for
that part waits here (*pending*) and goes in when the part is attached, so a save right after a
load loses nothing. Three forms:

* :meth:`state_dict` / :meth:`load_state_dict`: this rank's own state (DCP checkpoints, per rank);
* :meth:`gathered` / :meth:`load_gathered`: every rank's on rank 0 (a framework's one file);
* :meth:`load_other_world`: what any world size resumes from (steps, data position, schedule step).

Example::

    state = RuntimeState(config, rank, world_size, warn=print, info_warning=print)
    state.load_state_dict(saved)          # before the parts exist
    state.attach(sampler=sampler)         # takes its saved schedule now
    state.steps += 1
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import ConfigError, HeteroConfig, counted
from hetero_strategy.runtime.snapshot import dropped_message, residual_size, run_record

__all__ = ["PARTS", "RuntimeState"]

#: the checkpointed parts, by key: each has state_dict() / load_state_dict()
PARTS = ("sampler", "hook", "balancer", "scaler", "hybrid")


class RuntimeState:
    """This rank's parts by key (None until built), what a checkpoint left for them, the step count.

    Args:
        config: the run's :class:`HeteroConfig` (its record goes into gathered checkpoints).
        rank: this process's global rank.
        world_size: number of ranks.
        warn: where warnings go.
        info_warning: where a warning every rank would give alike goes (said once, by rank 0).
    """

    def __init__(self, config: HeteroConfig, rank: int, world_size: int, *, warn: Callable[[str], None],
                 info_warning: Callable[[str], None]) -> None:
        self.config, self.rank, self.world_size = config, rank, world_size
        self._warn, self._info_warning = warn, info_warning
        self.parts: dict[str, Any] = dict.fromkeys(PARTS)
        self.steps = 0  # optimizer steps taken (checkpointed), for adapters without a step counter
        self.memory_caps: list[int] | None = None  # samples per pass from the probe's memory (planner)
        self.memory_probe: list[Any] | None = None  # every rank's probed MemoryCost (planner)
        self._pending: dict[str, Any] = {}

    def attach(self, **parts: Any) -> None:
        """Parts built now (keys of :data:`PARTS`): each takes what a checkpoint left for it."""
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise KeyError(f"unknown runtime part(s) {sorted(unknown)}: the parts are {list(PARTS)}")
        self.parts.update(parts)
        self._restore_pending()

    def _restore_pending(self) -> None:
        for key, part in self.parts.items():
            if part is not None and key in self._pending and part.load_state_dict(self._pending.pop(key)) is False:
                self._info_warning("hetero: the saved batch split is for another global batch; this run's split "
                                   "stands, and the epoch goes on from the same sample (within one batch)")
        sampler = self.parts["sampler"]
        if sampler is not None and "sampler_position" in self._pending:  # saved under another world
            sampler.resume_at_samples(*self._pending.pop("sampler_position"))

    # ---- this rank's own state ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's state: sampler schedule, hook state (e.g. residuals), calibrator, ..., steps."""
        state = {key: part.state_dict() for key, part in self.parts.items() if part is not None}
        # Parts not built yet keep what a checkpoint gave them, so a save right after a load loses nothing.
        return {**{k: v for k, v in self._pending.items() if k not in state}, **state, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's state; parts built later (hook, sampler) take theirs when attached."""
        self._pending = {k: state[k] for k in PARTS if k in state}
        self.steps = int(state.get("steps", self.steps))
        self._restore_pending()

    def continue_from(self, previous: RuntimeState | None) -> None:
        """Start where ``previous`` (this rank's state in an earlier run of the same model) stopped,
        as through a checkpoint, except the batch plan and data position: they belong to the
        training loader, which the new run builds again."""
        if previous is not None and (previous.rank, previous.world_size) == (self.rank, self.world_size):
            self.load_state_dict({k: v for k, v in previous.state_dict().items() if k != "sampler"})

    # ---- every rank's, on rank 0 --------------------------------------------------------------
    def gathered(self, optimizer_states: Any = None) -> dict[str, Any]:
        """Every rank's :meth:`state_dict` on rank 0 (collective); other ranks get ``ranks: None``.

        With a hybrid part, ``optimizer_states`` (this rank's) ride along: local phases keep them
        per rank, and the framework's file holds rank 0's only (:meth:`own_optimizer_states`).
        """
        mine = self.state_dict()
        if self.parts["hybrid"] is not None and optimizer_states is not None:
            mine = {**mine, "optimizers": optimizer_states}
        gathered: list[Any] | None = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
            # NOTE: on the CPU: rank 0 would unpickle rank r's CUDA tensors onto cuda:r, which on
            # another node may not exist (residuals and hybrid optimizer states are on the device)
            dist.gather_object(_on_cpu(mine), gathered, dst=0)
        return {"ranks": gathered, "config": self.config.to_record(), "run": run_record(self, mine)}

    def load_gathered(self, saved: dict[str, Any]) -> bool:
        """Take this rank's part of :meth:`gathered`; False (and a warning) on a new world size,
        where the steps, schedule step and data position carry over (:meth:`load_other_world`)."""
        ranks = saved["ranks"]
        self.check_compatible(saved.get("config"), "checkpoint")
        if len(ranks) == self.world_size:
            self.load_state_dict(dict(ranks[self.rank]))
            return True
        if saved.get("run") is None:  # written before the run record existed
            self._info_warning(f"hetero: checkpoint holds state of {counted(len(ranks), 'rank')} but this job has "
                               f"{self.world_size}; batch plan, data position and residuals start fresh")
            return False
        self.load_other_world(saved["run"])
        self._info_warning(dropped_message(saved["run"]["world_size"], self.world_size,
                                           [residual_size(r.get("hook") or {}) for r in ranks]))
        return False

    def own_optimizer_states(self, saved: dict[str, Any]) -> Any:
        """This rank's own optimizer states in :meth:`gathered` (hybrid mode, same world size), or
        None: the framework's copy (rank 0's) stands."""
        ranks = saved.get("ranks")
        if self.parts["hybrid"] is None or not ranks or len(ranks) != self.world_size:
            return None
        return (ranks[self.rank] or {}).get("optimizers")

    # ---- across runs and world sizes ----------------------------------------------------------
    def check_compatible(self, record: dict[str, Any] | None, source: str) -> None:
        """Refuse state saved under another compression method: its residuals mean something else."""
        method = (record or {}).get("compression", {}).get("method")
        if method is not None and method != self.config.compression.method:
            raise ConfigError(f"{source} compression={method!r} is invalid for this run's compression="
                              f"{self.config.compression.method!r}: its residuals and hook state belong to "
                              f"{method!r}; resume with compression={method!r}, or start without the checkpoint")

    def load_other_world(self, run: dict[str, Any]) -> None:
        """Resume a run saved with another world size: the step count, the schedule step and the
        data position carry over; shares, residuals, calibrator and loss scale start fresh. In
        hybrid mode the phase and its history carry over, and the period restarts from the anchor."""
        self.steps = int(run["steps"])
        self._pending = {"sampler_position": (int(run["epoch"]), int(run["samples"]))}
        if run.get("hybrid") is not None:
            self._pending["hybrid"] = run["hybrid"]
        if run.get("hook_step") is not None:
            self._pending["hook"] = {"step": int(run["hook_step"])}
        self._restore_pending()


def _on_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in nested dicts, lists and tuples moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj
