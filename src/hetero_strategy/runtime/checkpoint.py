"""Periodic, asynchronous, atomic checkpoints of a whole run, one shard per rank.

Layout of ``checkpoint_dir``::

    step_00000040/            complete: DCP metadata and one data file per rank
    step_00000080.partial/    being written, or cut off by a crash: never read

A save is :func:`torch.distributed.checkpoint.async_save`: the state is copied to host memory
in the step that saves, then a background thread writes it while training goes on. Model and
optimizer are replicated, so DCP writes each tensor once, spread over the ranks. Each rank adds
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

import datetime
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from hetero_strategy.config import ConfigError
from hetero_strategy.runtime.save_schedule import SaveSchedule
from hetero_strategy.runtime.snapshot import RUN, module_of, optimizers_of, snapshot, unblob
from hetero_strategy.runtime.stall import StallError

__all__ = ["Checkpointer", "Resumed"]

_COMPLETE = re.compile(r"^step_(\d{8,})$")
_PARTIAL = ".partial"
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
        self._distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        # NOTE: every rank looks (the directory is shared), so every rank refuses alike, before any collective
        if cfg.resume == "never" and self.complete():
            raise ConfigError(f"checkpoint_dir={str(self.directory)!r} is invalid with resume='never': it holds "
                              f"checkpoints of an earlier run ({self.complete()[-1].name}), which would mix with "
                              "this run's; empty it, use another directory, or resume='auto'")
        # NOTE: DCP's async write runs collectives from its own thread: a group of its own keeps
        # them apart from the step's. Its timeout bounds a write a dead peer never finishes.
        timeout = datetime.timedelta(seconds=max(600.0, 10 * cfg.stall_timeout_s))
        self._group = dist.new_group(backend="gloo", timeout=timeout) if self._distributed else None
        self.schedule = SaveSchedule(self.rank, every_steps if every_steps is not None else cfg.checkpoint_every_steps,
                                     every_s if every_s is not None else cfg.checkpoint_every_s, self._distributed)
        self._future: Any = None
        self._writing: Path | None = None
        self._committed = threading.Event()
        self._commit_error: BaseException | None = None
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            for stale in self.directory.glob(f"step_*{_PARTIAL}"):  # a crash's leftovers
                shutil.rmtree(stale, ignore_errors=True)
            if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0 \
                    and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                runtime.warn(_SHARED_STORE)
        self._barrier()

    # ---- saving ----------------------------------------------------------------------
    def step_end(self, model: Any, optimizer: Any, step: int | None = None) -> bool:
        """After an optimizer step: save when due (True if it did)."""
        if not self.poll(step):
            return False
        self.save(model, optimizer, step)
        return True

    def poll(self, step: int | None = None) -> bool:
        """Once per optimizer step, on every rank: surface a finished write's error, and say whether
        a save is due now (an adapter may save a moment later, once the scheduler has stepped)."""
        if self._future is not None and self._future.done():
            self.wait()
        if step is None and not self.runtime.synced:  # hybrid: ranks between syncs are at different steps
            return False
        return self.schedule.due(self.runtime.checkpoint_step() if step is None else step)  # after step_end

    def save(self, model: Any, optimizer: Any, step: int | None = None) -> Path:
        """Start writing a checkpoint after ``step`` optimizer steps (collective); returns its final path."""
        self.wait()  # one write in flight at a time
        step = self.runtime.checkpoint_step() if step is None else step
        final = self.directory / f"step_{step:08d}"
        writing = final.with_name(final.name + _PARTIAL)
        state = snapshot(self.runtime, model, optimizer, self.stateful)
        with self.runtime.phase("checkpoint"):
            self._future = dcp.async_save(state, checkpoint_id=writing, process_group=self._group,
                                          no_dist=not self._distributed)
        self._writing, self._committed = writing, threading.Event()
        # NOTE: rank 0 commits from the writer thread the moment DCP's metadata is down, not at
        # its next step: a job killed meanwhile keeps the checkpoint
        self._future.add_done_callback(lambda f, w=writing, done=self._committed: self._commit(f, w, done))
        self.schedule.saved()
        return final

    def wait(self) -> None:
        """Finish the write in flight (rank 0 has then committed it); a failed write raises here."""
        if self._future is None:
            return
        future, committed = self._future, self._committed
        self._future = self._writing = None
        with self.runtime.phase("checkpoint"):
            future.result()
        committed.wait()
        if self._commit_error is not None:
            error, self._commit_error = self._commit_error, None
            raise error

    def _commit(self, future: Any, writing: Path, done: threading.Event) -> None:
        """Rank 0: rename the written directory to its final name, then drop the oldest beyond ``keep``."""
        try:
            if self.rank == 0 and future.exception() is None:
                final = writing.with_name(writing.name.removesuffix(_PARTIAL))
                if final.exists():  # the same step saved again after a restart: out of the way first
                    old = final.with_name(f"{final.name}.replaced{_PARTIAL}")
                    os.replace(final, old)
                    shutil.rmtree(old, ignore_errors=True)
                os.replace(writing, final)
                _fsync_dir(self.directory)
                for old in self.complete()[:-self.keep]:  # renamed first: never a half-deleted complete name
                    gone = old.with_name(old.name + _PARTIAL)
                    os.replace(old, gone)
                    shutil.rmtree(gone, ignore_errors=True)
        except Exception as e:  # noqa: BLE001 - raised by wait(), in the training thread
            self._commit_error = e
        finally:
            done.set()

    def close(self) -> None:
        """Wait for the last write (the end of training)."""
        self.wait()
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
        newest = [None]
        if self.rank == 0:
            complete = self.complete()
            newest = [str(complete[-1]) if complete else None]
        if self._distributed:  # rank 0's listing, so every rank reads the same one
            dist.broadcast_object_list(newest, src=0, group=self._group)
        if newest[0] is None:
            return None
        path = Path(newest[0])
        keys = self._read(path, lambda: dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
        saved_world = sum(1 for k in keys if k.startswith("hetero.rank"))
        same = saved_world == self.world_size
        # First the small parts: a refused checkpoint leaves the model untouched (DCP loads in place).
        small: dict[str, Any] = {RUN: None, "optim": None,
                                 **{f"extra.{k}": None for k in self.stateful if f"extra.{k}" in keys}}
        own_optim = f"hetero.optim{self.rank}"  # hybrid mode: this rank's own optimizer state
        if same:
            small[f"hetero.rank{self.rank}"] = None
            if own_optim in keys:
                small[own_optim] = None
        elif self.rank == 0:
            small.update({f"hetero.lost{r}": None for r in range(saved_world)})
        self._load(path, small)
        run = self._read(path, lambda: unblob(small[RUN]))
        self.runtime.check_compatible(run["config"], f"checkpoint {path}")
        module = module_of(model)
        self._load(path, {"model": module.state_dict()})  # in place, into the parameters
        optim = small[own_optim] if small.get(own_optim) is not None else small["optim"]
        for opt, state in zip(optimizers_of(optimizer), self._read(path, lambda: unblob(optim)), strict=True):
            opt.load_state_dict(state)
        for k, v in self.stateful.items():
            if f"extra.{k}" in small:
                v.load_state_dict(unblob(small[f"extra.{k}"]))
        if same:
            self.runtime.load_state_dict(unblob(small[f"hetero.rank{self.rank}"]))
        else:
            self.runtime.load_other_world(run)
            if self.rank == 0:
                self._say_dropped(run, [unblob(small[f"hetero.lost{r}"]) for r in range(saved_world)])
        epoch = self.runtime.sampler.position[0] if self.runtime.sampler is not None else run["epoch"]
        self.runtime.info(f"hetero: resumed from {path} after {run['steps']} steps (epoch {epoch})")
        return Resumed(path, int(run["steps"]), int(epoch), saved_world)

    def _load(self, path: Path, state: dict[str, Any]) -> None:
        with self.runtime.phase("checkpoint"):
            self._read(path, lambda: dcp.load(state, checkpoint_id=path, process_group=self._group,
                                              no_dist=not self._distributed))

    @staticmethod
    def _read(path: Path, read: Any) -> Any:
        """``read()``, with a damaged or foreign file said in one line (nothing else is caught)."""
        try:
            return read()
        except (ConfigError, StallError):
            raise
        except (CheckpointException, OSError, EOFError, ValueError, KeyError, RuntimeError) as e:
            cause = next(iter(getattr(e, "failures", {}).values()), e)  # DCP: each rank's (error, traceback)
            cause = cause[0] if isinstance(cause, tuple) else cause
            first = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0][:200]}"
            raise ConfigError(f"checkpoint {str(path)!r} is invalid: it cannot be read ({first}); it is cut off or "
                              "not a hetero_strategy checkpoint. Delete it to resume from the one before, or set "
                              "resume='never' to start fresh") from None

    def _say_dropped(self, run: dict, lost: list[dict]) -> None:
        values = sum(x["values"] for x in lost)
        l1 = sum(x["l1"] for x in lost)
        self.runtime.warn(f"hetero: checkpoint of {run['world_size']} ranks resumed on {self.world_size}: batch "
                          f"shares are planned for the new world and the error-feedback residuals of all "
                          f"{run['world_size']} old ranks are dropped ({values} values, L1 norm {l1:.6g})")

    def _barrier(self) -> None:
        if self._distributed:
            dist.barrier(group=self._group)


def _fsync_dir(path: Path) -> None:
    """The rename itself on disk (a power cut after the commit keeps it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
