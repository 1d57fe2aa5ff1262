"""Asynchronous, atomic ``torch.distributed.checkpoint`` writes, and readable read errors.

One write is in flight at a time. It goes to ``<final>.partial/``; once every rank's data and
DCP's metadata are down, rank 0 renames it to ``<final>/`` from the writer thread (the commit,
atomic on POSIX) and fsyncs the parent directory, so a job killed at any moment keeps the newest
committed checkpoint readable. Both checkpoint front ends use it: :class:`~hetero_strategy.
runtime.checkpoint.Checkpointer` (HeteroPlugin, bare DDP) and HeteroStrategy's
``state_dict_type="sharded"`` (Lightning's own checkpoints).
"""

from __future__ import annotations

import datetime
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hetero_strategy.config import ConfigError
from hetero_strategy.dist import StallError

__all__ = ["PARTIAL", "ShardedWriter", "is_sharded", "read_or_explain", "remove_committed", "sweep"]

PARTIAL = ".partial"
_REPLACED = f".replaced{PARTIAL}"


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a committed DCP checkpoint directory (its metadata file is written last)."""
    return (Path(path) / ".metadata").is_file()


class ShardedWriter:
    """Writes and reads DCP checkpoints on a gloo group of its own; collective: every rank builds one.

    Args:
        runtime: the run's runtime (its rank, ``phase`` for stall errors, config for the timeout).
    """

    def __init__(self, runtime: Any) -> None:
        self.runtime, self.rank = runtime, runtime.rank
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        # NOTE: DCP's async write runs collectives from its own thread: a group of its own keeps
        # them apart from the step's. Its timeout bounds a write a dead peer never finishes.
        timeout = datetime.timedelta(seconds=max(600.0, 10 * runtime.config.reliability.stall_timeout_s))
        self.group = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None
        self._future: Any = None
        self.writing: Path | None = None  # the directory being written, while a write is in flight
        self._committed = threading.Event()
        self._commit_error: BaseException | None = None
        self._lock = threading.Lock()
        self._after: list[Callable[[], None]] = []
        self._saved = False  # any save since construction: the same on every rank (save is collective)

    def save(self, state: dict[str, Any], final: Path) -> None:
        """Start writing ``state`` (this rank's part) to ``final`` (collective); the state is staged
        to host memory before this returns, so training may change it right after."""
        import torch.distributed.checkpoint as dcp  # NOTE: lazily: see read_or_explain

        self.wait()  # one write in flight at a time
        self.writing = writing = final.with_name(final.name + PARTIAL)
        if self.rank == 0:
            final.parent.mkdir(parents=True, exist_ok=True)
            sweep(final.parent)  # a crash's leftovers, the one under this name included
        self.barrier()
        self._saved = True
        with self.runtime.phase("checkpoint"):
            future = dcp.async_save(state, checkpoint_id=writing, process_group=self.group,
                                    no_dist=not self.distributed)
        with self._lock:
            self._future, self._committed = future, threading.Event()
        # NOTE: rank 0 commits from the writer thread the moment DCP's metadata is down, not at
        # its next step: a job killed meanwhile keeps the checkpoint
        future.add_done_callback(lambda f, w=writing, done=self._committed: self._commit(f, w, done))

    def then(self, action: Callable[[], None]) -> None:
        """Run ``action`` on rank 0 once the write in flight is committed (now when none is), e.g.
        removing an older checkpoint: a crash during the new write must still find the old one."""
        if self.rank != 0:
            return
        with self._lock:
            if self._future is not None and not self._committed.is_set():
                self._after.append(action)
                return
        action()

    def remove_after_commit(self, path: Path) -> None:
        """Remove the committed checkpoint ``path`` (rank 0) once the write in flight is committed."""
        self.then(lambda: remove_committed(path) if path.exists() else None)

    def close(self) -> None:
        """Finish the write in flight and free the writer's process group (collective after a save:
        every rank leaves with the last checkpoint committed)."""
        self.wait()
        if self._saved:
            # NOTE: rank 0 renames from its writer thread; a peer's wait() returns when its own part is
            # written, so without this it could leave (and list the directory) before the commit
            self.barrier()
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None

    def check(self) -> None:
        """Surface a finished write's error now (cheap: nothing waits for a write still running)."""
        with self._lock:
            done = self._future is not None and self._future.done()
        if done:
            self.wait()

    def wait(self) -> None:
        """Finish the write in flight (rank 0 has then committed it); a failed write raises here."""
        with self._lock:
            future, committed, self._future = self._future, self._committed, None
        self.writing = None
        if future is None:
            return
        with self.runtime.phase("checkpoint"):
            future.result()
        committed.wait()
        if self._commit_error is not None:
            error, self._commit_error = self._commit_error, None
            raise error

    def _commit(self, future: Any, writing: Path, done: threading.Event) -> None:
        """Rank 0: rename the written directory to its final name, then the actions waiting for it."""
        try:
            if self.rank == 0 and future.exception() is None:
                final = writing.with_name(writing.name.removesuffix(PARTIAL))
                old = final.with_name(final.name + _REPLACED)
                if final.exists():  # the same name saved again (a restart, Lightning's last.ckpt)
                    shutil.rmtree(old, ignore_errors=True)  # an earlier crash's copy: final is newer
                    os.replace(final, old)  # NOTE: a directory cannot be replaced in one rename
                os.replace(writing, final)
                _fsync_dir(final.parent)
                shutil.rmtree(old, ignore_errors=True)
        except Exception as e:  # noqa: BLE001 - raised by wait(), in the training thread
            self._commit_error = e
        finally:
            self._run_after(ok=self._commit_error is None and future.exception() is None, done=done)

    def _run_after(self, ok: bool, done: threading.Event) -> None:
        """The actions then() queued, until none is left; ``done`` is set under the same lock as
        the last look, so an action queued later sees it and runs itself. After a failed write
        they are dropped: the newer checkpoint is not there, so the older one stays."""
        while True:
            with self._lock:
                actions, self._after = self._after, []
                if not actions:
                    done.set()
                    return
            for action in actions if ok else ():
                try:
                    action()
                except Exception as e:  # noqa: BLE001 - raised by the next wait()
                    self._commit_error = e

    def load(self, path: Path, state: dict[str, Any], *, collective: bool = True) -> None:
        """Fill ``state`` in place from ``path``; ``collective=False`` reads on this rank alone."""
        import torch.distributed.checkpoint as dcp  # NOTE: lazily: see read_or_explain

        distributed = self.distributed and collective
        with self.runtime.phase("checkpoint"):
            read_or_explain(path, lambda: dcp.load(state, checkpoint_id=path, process_group=self.group,
                                                   no_dist=not distributed))

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)


def remove_committed(path: Path) -> None:
    """Remove a committed checkpoint: renamed first, so no complete-looking half is ever left."""
    gone = path.with_name(f"{path.name}.removed-{uuid.uuid4().hex[:8]}{PARTIAL}")
    os.replace(path, gone)
    shutil.rmtree(gone, ignore_errors=True)


def sweep(directory: Path) -> list[str]:
    """Rank 0, before writing into ``directory``: settle what a crash left (returns what it did).

    * ``X.replaced.partial`` (the old copy of a name saved again): put back when ``X`` is missing
      (the crash fell between the two renames), else deleted;
    * ``X.partial`` with DCP's metadata (written last) and no ``X``: a complete write whose rename
      was cut off, committed now;
    * anything else ending in ``.partial`` (a cut-off write, a half-deleted checkpoint): deleted.
    """
    done = []
    for leftover in sorted(directory.glob(f"*{PARTIAL}")):
        name = leftover.name
        final = directory / (name.removesuffix(_REPLACED) if name.endswith(_REPLACED) else name.removesuffix(PARTIAL))
        whole = name.endswith(_REPLACED) or (".removed-" not in name and is_sharded(leftover))
        if whole and not final.exists():
            os.replace(leftover, final)
            done.append(f"recovered {final.name}")
        else:
            shutil.rmtree(leftover, ignore_errors=True)
            done.append(f"removed {name}")
    return done


def read_or_explain(path: Path, read: Callable[[], Any]) -> Any:
    """``read()``, with a damaged or foreign checkpoint said in one line (nothing else is caught)."""
    # NOTE: torch.distributed.checkpoint is imported where a checkpoint is written or read, not at
    # the top: it pulls in torch.distributed.elastic, about 0.1 s that every process registering
    # strategy="hetero" with Lightning would pay (benchmarks/bench_import.py)
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return read()
    except (ConfigError, StallError):
        raise
    except (CheckpointException, OSError, EOFError, ValueError, KeyError, RuntimeError) as e:
        cause = next(iter(getattr(e, "failures", {}).values()), e)  # DCP: each rank's (error, traceback)
        cause = cause[0] if isinstance(cause, tuple) else cause
        first = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0][:200]}"
        raise ConfigError(f"checkpoint {str(path)!r} is invalid: it cannot be read ({first}); it is cut off or "
                          "not a hetero_strategy checkpoint. Delete it to resume from the one before, or start fresh "
                          "(resume='never'; under Lightning another ckpt_path)") from None


def _fsync_dir(path: Path) -> None:
    """The rename itself on disk (a power cut after the commit keeps it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
