"""HeteroStrategy's checkpoints: Lightning's file with every rank's state, or a sharded directory.

``state_dict_type="full"`` (default): Lightning's own single file, written by rank 0, with every
rank's hetero state gathered into it (Lightning would otherwise lose the other ranks' residuals).

``state_dict_type="sharded"``: every rank writes its own shard of the checkpoint through
``torch.distributed.checkpoint``, asynchronously, into a directory named as Lightning names the
file (``epoch=0-step=400.ckpt/``), committed by an atomic rename
(:mod:`hetero_strategy.runtime.dict_checkpoint`). ``ModelCheckpoint`` keeps deciding when
(``every_n_train_steps``, ``train_time_interval``) and what to keep (``save_top_k``,
``save_last``); an older checkpoint it drops is removed only once the newer one is committed.
``Trainer.fit(ckpt_path=...)`` reads either format, whatever ``state_dict_type`` says.

In ``mode="hybrid"`` a save must come where every rank holds the same model (``runtime.synced``:
epoch and validation ends; step-based ModelCheckpoints are refused at setup), and each rank's own
optimizer state rides in its hetero state, since local phases keep it per rank.

HeteroStrategy holds one :class:`CheckpointFormats` and its ``save_checkpoint``,
``remove_checkpoint`` and ``load_checkpoint`` call it around Lightning's own file I/O.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hetero_strategy.config import ConfigError
from hetero_strategy.runtime.dict_checkpoint import load_dict_checkpoint, save_dict_checkpoint
from hetero_strategy.runtime.sharded_io import ShardedWriter

__all__ = ["STATE_DICT_TYPES", "CheckpointFormats", "check_state_dict_type", "readable_checkpoint"]

STATE_DICT_TYPES = ("full", "sharded")
_CKPT_KEY = "hetero_strategy"
_KEYS = dict(model_key="state_dict", optim_key="optimizer_states")


def check_state_dict_type(value: Any) -> None:
    if value not in STATE_DICT_TYPES:
        raise ConfigError(f"state_dict_type={value!r} is invalid: choose 'full' (Lightning's single file, "
                          "rank 0 writes it) or 'sharded' (every rank writes its own shard, asynchronously)")


class CheckpointFormats:
    """Both checkpoint formats of one strategy, and the sharded writer between its saves.

    Every method takes the strategy's current runtime (a Trainer's each run builds a new one).
    """

    def __init__(self) -> None:
        self._writer: ShardedWriter | None = None

    def _sharded_writer(self, runtime: Any) -> ShardedWriter:
        """The writer, built at the first sharded save or load: collective (a process group of its
        own), and Lightning saves and loads on every rank at the same point."""
        if self._writer is None:
            self._writer = ShardedWriter(runtime)
        return self._writer

    def close(self) -> None:
        """Finish the sharded write in flight and free its group (the end of fit; a failed write raises here)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    # ---- save ----------------------------------------------------------------------------
    def gather_into(self, checkpoint: dict[str, Any], runtime: Any) -> None:
        """state_dict_type="full": every rank's hetero state into the checkpoint rank 0 writes."""
        # NOTE: Lightning writes rank 0's checkpoint only; per-rank state (error-feedback
        # residuals) would be lost, so every rank's state is gathered into it first.
        with runtime.phase("checkpoint"):
            checkpoint[_CKPT_KEY] = runtime.gathered_state_dict(checkpoint.get(_KEYS["optim_key"]))

    def save_sharded(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any, runtime: Any) -> None:
        """state_dict_type="sharded": this rank's shard, written asynchronously."""
        if storage_options is not None:
            raise ConfigError(f"storage_options={storage_options!r} is invalid with state_dict_type='sharded': "
                              "every rank writes its own shard through torch.distributed.checkpoint; drop it")
        save_dict_checkpoint(self._sharded_writer(runtime), runtime, checkpoint, Path(filepath), **_KEYS)

    def remove_after_commit(self, filepath: Any) -> bool:
        """A sharded checkpoint ModelCheckpoint drops goes once the one in flight is committed;
        False where Lightning's own removal applies."""
        if self._writer is None or not Path(filepath).is_dir():
            return False
        # NOTE: ModelCheckpoint drops the old one while the new one is still being written: a
        # crash then must still find the old one, so it goes once the new one is committed
        self._writer.remove_after_commit(Path(filepath))
        return True

    # ---- load ----------------------------------------------------------------------------
    def settle(self) -> None:
        """Before a load: a save of this run may be the one asked for."""
        if self._writer is not None:
            self._writer.wait()
            self._writer.barrier()  # NOTE: rank 0 commits after the others' wait() returned

    def load_sharded(self, checkpoint_path: Any, model_state: dict[str, Any], runtime: Any) -> dict[str, Any]:
        """A sharded directory, read into ``model_state`` in place; the runtime takes its hetero state."""
        return load_dict_checkpoint(self._sharded_writer(runtime), runtime, Path(checkpoint_path), model_state,
                                    **_KEYS)

    def restore(self, checkpoint: dict[str, Any], runtime: Any) -> dict[str, Any]:
        """Lightning's file as read: the runtime takes this rank's part of the gathered hetero state."""
        saved = checkpoint.get(_CKPT_KEY)
        if saved is not None:
            runtime.load_gathered_state_dict(saved)
            own = runtime.own_optimizer_states(saved)
            if own is not None:  # hybrid mode: this rank's own, not rank 0's
                checkpoint[_KEYS["optim_key"]] = own
        return checkpoint


@contextmanager
def readable_checkpoint(checkpoint_path: Any) -> Generator[None, None, None]:
    """Around Lightning's read of a checkpoint file: a cut-off or foreign file becomes a ConfigError."""
    try:
        yield
    except (RuntimeError, EOFError, IsADirectoryError) as e:
        # NOTE: only torch.load's words for a cut-off or foreign file; weights-only refusals and
        # out-of-memory errors carry their own instructions and pass through unchanged
        words = str(e).lower()
        if not isinstance(e, (EOFError, IsADirectoryError)) and "zip archive" not in words \
                and "central directory" not in words:
            raise
        raise ConfigError(f"ckpt_path={str(checkpoint_path)!r} is invalid: it cannot be read as a checkpoint "
                          f"({str(e).splitlines()[0][:200]}); it is truncated or not a Lightning checkpoint: "
                          "pass a complete one") from e
