"""Periodic, asynchronous, atomic checkpoints of a whole run, one shard per rank.

Layout of ``checkpoint_dir``::

    step_00000040/            complete: DCP metadata and one data file per rank
    step_00000080.partial/    being written, or cut off by a crash: never read

A save is :func:`torch.distributed.checkpoint.async_save`: the state is copied to host memory
in the step that saves, then a background thread writes it while training goes on. Model and
optimizer are replicated under DDP, so DCP writes each tensor once, spread over the ranks; under
FSDP2 each rank writes its own shards of both, and a resume reshards them to its world. Each rank adds
its own hetero state (residuals, split schedule and sampler position, calibrator, loss scale)
under its own key, so nothing is gathered on rank 0. Once every rank's data is on disk, DCP's
coordinator writes the metadata and rank 0 renames the directory. The rename is the commit
(atomic on POSIX): a crash at any moment leaves the previous complete checkpoint the newest.

A different world size on resume (an elastic restart with fewer or more ranks) keeps the model,
the optimizer, the step count, the schedule step and the data position; the batch shares are
planned for the new world and every old rank's error-feedback residuals are dropped, with their
size logged (docs/reliability.md says why).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hetero_strategy.config import ConfigError
from hetero_strategy.runtime.save_schedule import SaveSchedule
from hetero_strategy.runtime.sharded_io import ShardedWriter, read_or_explain, remove_committed, sweep
from hetero_strategy.runtime.sharded_optim import PREFIX as SHARD_PREFIX
from hetero_strategy.runtime.sharded_optim import load_sharded_optimizers
from hetero_strategy.runtime.snapshot import (
    RUN,
    dropped_message,
    module_of,
    optimizers_of,
    restore_rng,
    snapshot,
    unblob,
)

__all__ = ["Checkpointer", "Resumed", "read_small", "restore_hetero"]

_COMPLETE = re.compile(r"^step_(\d{8,})$")
_SHARED_STORE = ("hetero: torchrun restarts workers on the rendezvous store of the first attempt, where the "
                 "restarted ranks can read the previous attempt's addresses and hang or fail to connect at "
                 "init_process_group (pytorch/pytorch#135712). Launch with --rdzv-backend c10d and "
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for restarts that work (docs/reliability.md)")


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run stands: the checkpoint read, optimizer steps done, the epoch to run."""

    path: Path
    steps: int
    epoch: int
    world_size_saved: int


class Checkpointer:
    """Saves ``model`` and ``optimizer`` with the runtime's state; collective: every rank builds one.

    Args:
        runtime: the run's :class:`~hetero_strategy.runtime.HeteroRuntime`.
        directory: where checkpoints go (default: ``reliability.checkpoint_dir``).
        every_steps: save every this many optimizer steps (default: ``checkpoint_every_steps``).
        every_s: save after this many seconds (default: ``checkpoint_every_s``).
        keep: complete checkpoints kept (default: ``keep_checkpoints``).
        stateful: more objects with ``state_dict``/``load_state_dict`` (e.g. LR schedulers), by name.

    Example (bare DDP; ``resume`` is also what an elastic restart runs)::

        ckpt = Checkpointer(runtime, "ckpt", every_steps=100, stateful={"sched": scheduler})
        resumed = ckpt.resume(ddp_model, optimizer)       # None on a fresh start
        for epoch in range(resumed.epoch if resumed else 0, epochs):
            loader.batch_sampler.set_epoch(epoch)
            for batch in loader:
                ...; runtime.step_end(); ckpt.step_end(ddp_model, optimizer)
        ckpt.close()                                      # waits for the last write
    """

    def __init__(self, runtime: Any, directory: str | os.PathLike | None = None, *, every_steps: int | None = None,
                 every_s: float | None = None, keep: int | None = None, stateful: dict[str, Any] | None = None) -> None:
        cfg = runtime.config.reliability
        directory = directory if directory is not None else cfg.checkpoint_dir
        if directory is None:
            raise ConfigError("checkpoint_dir=None is invalid for a Checkpointer: give the directory checkpoints "
                              "go to (reliability.checkpoint_dir)")
        self.runtime, self.rank, self.world_size = runtime, runtime.rank, runtime.world_size
        self.stateful = dict(stateful or {})
        self.directory = Path(directory)
        self.keep = keep if keep is not None else cfg.keep_checkpoints
        # NOTE: every rank looks (the directory is shared), so every rank refuses alike, before any collective
        if cfg.resume == "never" and self.complete():
            raise ConfigError(f"checkpoint_dir={str(self.directory)!r} is invalid with resume='never': it holds "
                              f"checkpoints of an earlier run ({self.complete()[-1].name}), which would mix with "
                              "this run's; empty it, use another directory, or resume='auto'")
        self.writer = ShardedWriter(runtime)
        self.schedule = SaveSchedule(self.rank, every_steps if every_steps is not None else cfg.checkpoint_every_steps,
                                     every_s if every_s is not None else cfg.checkpoint_every_s,
                                     self.writer.distributed)
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            for done in sweep(self.directory):  # a crash's leftovers
                if done.startswith("recovered"):
                    runtime.warn(f"hetero: {done} in {self.directory} (written completely, then cut off before "
                                 "its commit)")
            if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0 \
                    and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                runtime.warn(_SHARED_STORE)
        self.writer.barrier()

    # ---- saving ----------------------------------------------------------------------
    def step_end(self, model: Any, optimizer: Any, step: int | None = None) -> bool:
        """After an optimizer step: save when due (True if it did)."""
        if not self.poll(step):
            return False
        self.save(model, optimizer, step)
        return True

    def poll(self, step: int | None = None) -> bool:
        """Once per optimizer step, on every rank: surface a finished write's error, and say whether a save is due now (an adapter may
        save a moment later, once the scheduler has stepped)."""
        self.writer.check()
        if step is None and not self.runtime.synced:  # hybrid: ranks between syncs are at different steps
            return False
        return self.schedule.due(self.runtime.checkpoint_step() if step is None else step)  # steps done, after step_end

    def save(self, model: Any, optimizer: Any, step: int | None = None) -> Path:
        """Start writing a checkpoint after ``step`` optimizer steps (collective); returns its final path."""
        step = self.runtime.checkpoint_step() if step is None else step
        final = self.directory / f"step_{step:08d}"
        self.writer.save(snapshot(self.runtime, model, optimizer, self.stateful), final)
        self.writer.then(self._prune)
        self.schedule.saved()
        return final

    def _prune(self) -> None:
        for old in self.complete()[:-self.keep]:
            remove_committed(old)

    def wait(self) -> None:
        """Finish the write in flight (rank 0 has then committed it); a failed write raises here."""
        self.writer.wait()

    def close(self) -> None:
        """Wait for the last write (the end of training) and free the writer's process group."""
        self.writer.close()
        self.schedule.close()

    # ---- resuming --------------------------------------------------------------------
    def complete(self) -> list[Path]:
        """Complete checkpoints in the directory, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.iterdir() if p.is_dir() and _COMPLETE.match(p.name)]
        return sorted(found, key=lambda p: int(_COMPLETE.match(p.name).group(1)))

    def resume(self, model: Any, optimizer: Any) -> Resumed | None:
        """Load the newest complete checkpoint into ``model``, ``optimizer``(s), the ``stateful``
        objects and the runtime (collective); None when there is none or ``resume="never"``."""
        if self.runtime.config.reliability.resume == "never":
            return None
        self.writer.wait()
        self.writer.barrier()  # NOTE: rank 0 commits after the others' wait() returned: list after it
        newest = [None]
        if self.rank == 0:
            complete = self.complete()
            newest = [str(complete[-1]) if complete else None]
        if self.writer.distributed:  # rank 0's listing, so every rank reads the same one
            dist.broadcast_object_list(newest, src=0, group=self.writer.group)
        if newest[0] is None:
            return None
        path = Path(newest[0])
        extras = [f"extra.{k}" for k in self.stateful]
        small = read_small(self.writer, path, ["optim", *extras])
        own = small.get(f"hetero.optim{self.rank}")  # hybrid mode: this rank's own optimizer state
        optim = read_or_explain(path, lambda: unblob(own if own is not None else small["optim"]))
        optimizers = optimizers_of(optimizer)
        _check_optimizers(path, optimizers, optim)  # before the model changes: a refusal touches nothing
        self.writer.load(path, {"model": module_of(model).state_dict()})  # in place, into the parameters
        if any(k.startswith(SHARD_PREFIX) for k in small["saved_keys"]):  # FSDP2: resharded to this world
            load_sharded_optimizers(lambda s: self.writer.load(path, s), small["saved_keys"], optimizers, optim)
        else:
            for opt, state in zip(optimizers, optim, strict=True):
                opt.load_state_dict(state)
        for k, v in self.stateful.items():
            if small.get(f"extra.{k}") is not None:
                v.load_state_dict(unblob(small[f"extra.{k}"]))
        run = restore_hetero(self.runtime, path, small)
        epoch = self.runtime.sampler.position[0] if self.runtime.sampler is not None else run["epoch"]
        self.runtime.info(f"hetero: resumed from {path} after {run['steps']} steps (epoch {epoch})")
        return Resumed(path, int(run["steps"]), int(epoch), int(run["world_size"]))


def _check_optimizers(path: Path, optimizers: list[Any], saved: list[dict]) -> None:
    """The saved optimizer states fit these optimizers (torch's own check, done before any load)."""
    mine = [[len(g["params"]) for g in o.param_groups] for o in optimizers]
    theirs = [[len(g["params"]) for g in state["param_groups"]] for state in saved]
    if mine != theirs:
        raise ConfigError(f"checkpoint {str(path)!r} is invalid for this run: its optimizer(s) hold parameter "
                          f"groups of sizes {theirs}, this run's {mine}; resume with the same model and "
                          "optimizers, or start without the checkpoint (resume='never', another directory)")


def read_small(writer: ShardedWriter, path: Path, keys: list[str]) -> dict[str, Any]:
    """The run record, this rank's hetero state (or every old rank's residual size under another
    world size) and the blobs ``keys`` that the checkpoint holds, without touching any model
    (collective). A checkpoint refused here leaves the model untouched: DCP loads in place."""
    import torch.distributed.checkpoint as dcp  # NOTE: lazily (sharded_io.read_or_explain says why)

    saved = read_or_explain(path, lambda: dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
    rank, world = writer.rank, writer.runtime.world_size
    saved_world = sum(1 for k in saved if k.startswith("hetero.rank"))
    small: dict[str, Any] = {RUN: None, **{k: None for k in keys if k in saved}}
    if saved_world == world:
        small.update({k: None for k in (f"hetero.rank{rank}", f"hetero.rng{rank}", f"hetero.optim{rank}")
                      if k in saved})
    elif rank == 0:
        small.update({f"hetero.lost{r}": None for r in range(saved_world)})
    writer.load(path, small)
    small["run"] = run = read_or_explain(path, lambda: unblob(small[RUN]))
    small["saved_world"], small["saved_keys"] = saved_world, saved
    writer.runtime.state.check_compatible(run["config"], f"checkpoint {path}")
    return small


def restore_hetero(runtime: Any, path: Path, small: dict[str, Any]) -> dict[str, Any]:
    """Put :func:`read_small`'s hetero state into ``runtime``; returns the run record.

    Under the same world size each rank takes its own state back (and its RNG states). Under
    another, the steps, schedule step and data position carry over, shares are planned anew and
    every old rank's residuals are dropped, with their size logged (docs/reliability.md).
    """
    run = small["run"]
    if small["saved_world"] == runtime.world_size:
        runtime.load_state_dict(unblob(small[f"hetero.rank{runtime.rank}"]))
        if small.get(f"hetero.rng{runtime.rank}") is not None:
            restore_rng(unblob(small[f"hetero.rng{runtime.rank}"]))
        return run
    runtime.state.load_other_world(run)
    if runtime.rank == 0:
        lost = [unblob(small[f"hetero.lost{r}"]) for r in range(small["saved_world"])]
        runtime.warn(dropped_message(run["world_size"], runtime.world_size, lost))
    return run
