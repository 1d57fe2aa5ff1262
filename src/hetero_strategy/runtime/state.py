"""The checkpointable side of :class:`~hetero_strategy.runtime.HeteroRuntime`: per-rank state in
and out, and the gathered form a framework's rank-0 checkpoint file carries."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import ConfigError
from hetero_strategy.runtime.snapshot import dropped_message, residual_size, run_record

__all__ = ["RuntimeState"]


class RuntimeState:
    """Mixin of HeteroRuntime: needs ``_parts()``, ``_restore_pending()``, ``_pending``, ``steps``,
    ``config``, ``world_size``, ``rank`` and ``warn``."""

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: sampler schedule, hook state (e.g. residuals), calibrator."""
        state = {key: part.state_dict() for key, part in self._parts().items() if part is not None}
        # Parts not built yet keep what a checkpoint gave them, so a save right after a load loses nothing.
        return {**{k: v for k, v in self._pending.items() if k not in state}, **state, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's state; parts built later (hook, sampler) take theirs when built."""
        self._pending = {k: state[k] for k in self._parts() if k in state}
        self.steps = int(state.get("steps", self.steps))
        self._restore_pending()

    def continue_from(self, previous: Any) -> None:
        """Start where ``previous`` (this rank's runtime of an earlier run of the same model, e.g.
        Lightning's first ``fit`` on one Trainer) stopped: loss scale, residuals, calibration and
        step count carry over, as through a checkpoint. The batch plan and data position do not:
        they belong to the training loader, which the new run builds again (its batch size or
        data may differ)."""
        if previous is not None and (previous.rank, previous.world_size) == (self.rank, self.world_size):
            self.load_state_dict({k: v for k, v in previous.state_dict().items() if k != "sampler"})

    def gathered_state_dict(self, optimizer_states: Any = None) -> dict[str, Any]:
        """Every rank's :meth:`state_dict` on rank 0 (collective), for a checkpoint rank 0 writes.

        Other ranks get ``ranks: None`` (their copy is not written); gathering to rank 0 only keeps
        W copies of every rank's residuals off the other ranks. In hybrid mode ``optimizer_states``
        (this rank's, as the framework saves them) ride along: local phases keep them per rank,
        and the framework's file holds rank 0's only (:meth:`own_optimizer_states` reads them back).
        """
        mine = self.state_dict()
        if getattr(self, "hybrid", None) is not None and optimizer_states is not None:
            mine = {**mine, "optimizers": optimizer_states}
        gathered: list[Any] | None = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
            # NOTE: on the CPU: rank 0 would unpickle rank r's CUDA tensors onto cuda:r, which on
            # another node may not exist (residuals and hybrid optimizer states are on the device)
            dist.gather_object(_on_cpu(mine), gathered, dst=0)
        return {"ranks": gathered, "config": self.config.to_record(), "run": run_record(self, mine)}

    def load_gathered_state_dict(self, saved: dict[str, Any]) -> bool:
        """Take this rank's part of :meth:`gathered_state_dict`; False (and a warning) on a new world
        size, where the steps, schedule step and data position carry over (:meth:`load_other_world`)."""
        ranks = saved["ranks"]
        self.check_compatible(saved.get("config"), "checkpoint")
        if len(ranks) == self.world_size:
            self.load_state_dict(dict(ranks[self.rank]))
            return True
        if saved.get("run") is None:  # written before the run record existed
            self.warn(f"hetero: checkpoint holds state of {len(ranks)} ranks but this job has "
                      f"{self.world_size}; batch plan, data position and residuals start fresh")
            return False
        self.load_other_world(saved["run"])
        self.info_warning(dropped_message(saved["run"]["world_size"], self.world_size,
                                          [residual_size(r.get("hook") or {}) for r in ranks]))
        return False

    def own_optimizer_states(self, saved: dict[str, Any]) -> Any:
        """This rank's own optimizer states in :meth:`gathered_state_dict` (hybrid mode, same world
        size), or None: the framework's copy (rank 0's) stands."""
        ranks = saved.get("ranks")
        if getattr(self, "hybrid", None) is None or not ranks or len(ranks) != self.world_size:
            return None
        return (ranks[self.rank] or {}).get("optimizers")

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
