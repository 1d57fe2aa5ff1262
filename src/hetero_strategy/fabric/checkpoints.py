"""``fabric.save`` / ``fabric.load`` with every rank's hetero state in Fabric's one file.

Fabric's DDP writes the file on rank 0 only, so per-rank state (the sampler's position and split
schedule, error-feedback residuals, the calibrator, the loss scale) is gathered into it first, under
one key; every rank reads the file on load and the runtime takes its own rank's part back. The key
is taken out of what ``fabric.load`` returns, so the user's ``strict`` keys are Fabric's as before.
"""

from __future__ import annotations

from typing import Any

from hetero_strategy.config import ConfigError

__all__ = ["CKPT_KEY", "TakingHeteroState", "with_hetero_state"]

CKPT_KEY = "hetero_strategy"


def with_hetero_state(state: dict[str, Any], runtime: Any) -> dict[str, Any]:
    """``state`` plus every rank's hetero state on rank 0 (collective: fabric.save runs on every rank)."""
    if CKPT_KEY in state:
        raise ConfigError(f"state[{CKPT_KEY!r}] is invalid in fabric.save: HeteroFabricStrategy keeps every rank's "
                          "hetero state under that key; rename your entry")
    with runtime.phase("checkpoint"):
        return {**state, CKPT_KEY: runtime.gathered_state_dict()}


class TakingHeteroState:
    """The strategy's CheckpointIO during a load: the file as read, its hetero part handed to the runtime."""

    def __init__(self, inner: Any, runtime: Any) -> None:
        self.inner, self.runtime = inner, runtime

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        checkpoint = self.inner.load_checkpoint(*args, **kwargs)
        saved = checkpoint.pop(CKPT_KEY, None) if isinstance(checkpoint, dict) else None
        if saved is not None:
            self.runtime.load_gathered_state_dict(saved)
        return checkpoint

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "runtime"):  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
