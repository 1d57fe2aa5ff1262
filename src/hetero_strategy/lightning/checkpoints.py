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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetero_strategy.config import ConfigError
from hetero_strategy.runtime.dict_checkpoint import load_dict_checkpoint, save_dict_checkpoint
from hetero_strategy.runtime.sharded_io import ShardedWriter, is_sharded

__all__ = ["STATE_DICT_TYPES", "CheckpointFormats", "check_state_dict_type"]

STATE_DICT_TYPES = ("full", "sharded")
_CKPT_KEY = "hetero_strategy"
_KEYS = dict(model_key="state_dict", optim_key="optimizer_states")


def check_state_dict_type(value: Any) -> None:
    if value not in STATE_DICT_TYPES:
        raise ConfigError(f"state_dict_type={value!r} is invalid: choose 'full' (Lightning's single file, "
                          "rank 0 writes it) or 'sharded' (every rank writes its own shard, asynchronously)")


class CheckpointFormats:
    """Mixin of HeteroStrategy (before DDPStrategy): needs ``runtime``, ``state_dict_type``,
    ``lightning_module`` and ``is_global_zero``."""

    _writer: ShardedWriter | None = None

    def _sharded_writer(self) -> ShardedWriter:
        """The writer, built at the first sharded save or load: collective (a process group of its
        own), and Lightning saves and loads on every rank at the same point."""
        if self._writer is None:
            self._writer = ShardedWriter(self.runtime)
        return self._writer

    def close_checkpoints(self) -> None:
        """Finish the sharded write in flight and free its group (the end of fit; a failed write raises here)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def hetero_state_dict(self) -> dict:
        """This rank's hetero state: sampler schedule, hook state (e.g. residuals), calibrator."""
        return self.runtime.state_dict()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        self.runtime.require_synced("a checkpoint save")
        if self.state_dict_type == "sharded":
            if storage_options is not None:
                raise ConfigError(f"storage_options={storage_options!r} is invalid with state_dict_type='sharded': "
                                  "every rank writes its own shard through torch.distributed.checkpoint; drop it")
            save_dict_checkpoint(self._sharded_writer(), self.runtime, checkpoint, Path(filepath), **_KEYS)
            return
        # NOTE: Lightning writes rank 0's checkpoint only; per-rank state (error-feedback
        # residuals) would be lost, so every rank's state is gathered into it first.
        with self.runtime.phase("checkpoint"):
            checkpoint[_CKPT_KEY] = self.runtime.gathered_state_dict(checkpoint.get(_KEYS["optim_key"]))
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def remove_checkpoint(self, filepath: Any) -> None:
        if self._writer is not None and Path(filepath).is_dir():
            # NOTE: ModelCheckpoint drops the old one while the new one is still being written: a
            # crash then must still find the old one, so it goes once the new one is committed
            self._writer.remove_after_commit(Path(filepath))
            return
        super().remove_checkpoint(filepath)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        if self._writer is not None:  # a save of this run may be the one asked for
            self._writer.wait()
            self._writer.barrier()  # NOTE: rank 0 commits after the others' wait() returned
        if is_sharded(checkpoint_path):
            model_state = self.lightning_module.state_dict()  # read in place: no second copy of the model
            return load_dict_checkpoint(self._sharded_writer(), self.runtime, Path(checkpoint_path), model_state,
                                        **_KEYS)
        try:
            checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
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
        saved = checkpoint.get(_CKPT_KEY)
        if saved is not None:
            self.runtime.load_gathered_state_dict(saved)
            own = self.runtime.own_optimizer_states(saved)
            if own is not None:  # hybrid mode: this rank's own, not rank 0's
                checkpoint[_KEYS["optim_key"]] = own
        return checkpoint
