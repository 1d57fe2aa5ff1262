"""A framework's own checkpoint dict (Lightning's), written as one DCP shard per rank.

Instead of the framework's rank-0 file with every rank's hetero state gathered into it, every
rank hands its part to :class:`~hetero_strategy.runtime.sharded_io.ShardedWriter`:

* ``model``: the dict's model tensors, replicated, so DCP writes each once, spread over ranks;
* ``frame.rest`` (rank 0 only): everything else the framework put in the dict (loops, callbacks,
  schedulers, its precision state) as one blob, since only rank 0's copy is authoritative;
* ``frame.optim`` (rank 0 only): the optimizer states, as the framework gave them;
* the hetero keys of :func:`~hetero_strategy.runtime.snapshot.hetero_snapshot`, each rank its own.

Reading gives the framework its dict back with the same keys, so its own restore code runs
unchanged, and puts the hetero state into the runtime (under another world size as
:func:`~hetero_strategy.runtime.checkpoint.restore_hetero` says).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetero_strategy.config import ConfigError
from hetero_strategy.runtime.checkpoint import read_small, restore_hetero
from hetero_strategy.runtime.sharded_io import ShardedWriter
from hetero_strategy.runtime.snapshot import blob, hetero_snapshot, unblob

__all__ = ["load_dict_checkpoint", "save_dict_checkpoint"]

_REST, _OPTIM = "frame.rest", "frame.optim"


def save_dict_checkpoint(writer: ShardedWriter, runtime: Any, checkpoint: dict[str, Any], path: Path, *,
                         model_key: str, optim_key: str) -> None:
    """Start the asynchronous write of ``checkpoint`` to the directory ``path`` (collective)."""
    state: dict[str, Any] = {"model": checkpoint[model_key], **hetero_snapshot(runtime)}
    if getattr(runtime, "hybrid", None) is not None and optim_key in checkpoint:
        # NOTE: local phases keep optimizer state per rank: each rank's own, as Checkpointer does
        state[f"hetero.optim{runtime.rank}"] = blob(checkpoint[optim_key])
    if runtime.rank == 0:
        state[_REST] = blob({k: v for k, v in checkpoint.items() if k not in (model_key, optim_key)})
        if optim_key in checkpoint:
            state[_OPTIM] = blob(checkpoint[optim_key])
    writer.save(state, path)


def load_dict_checkpoint(writer: ShardedWriter, runtime: Any, path: Path, model_state: dict[str, Any], *,
                         model_key: str, optim_key: str) -> dict[str, Any]:
    """The checkpoint dict saved at ``path``; the model tensors are read into ``model_state`` in
    place (collective; a write of ``path`` must be committed first). A checkpoint refused for its
    config leaves ``model_state`` untouched."""
    small = read_small(writer, path, [_REST, _OPTIM])
    if small.get(_REST) is None:  # a Checkpointer's directory: no framework state to give back
        raise ConfigError(f"checkpoint {str(path)!r} is invalid here: a Checkpointer (HeteroPlugin's "
                          "checkpoint_dir, bare DDP) wrote it, not HeteroStrategy(state_dict_type='sharded'); "
                          "resume it with Checkpointer.resume, or pass a Lightning checkpoint")
    writer.load(path, {"model": model_state})
    checkpoint = unblob(small[_REST])
    checkpoint[model_key] = model_state
    own = small.get(f"hetero.optim{runtime.rank}")  # hybrid mode: this rank's own optimizer state
    if own is not None or small.get(_OPTIM) is not None:
        checkpoint[optim_key] = unblob(own if own is not None else small[_OPTIM])
    restore_hetero(runtime, path, small)
    return checkpoint
