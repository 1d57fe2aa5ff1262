"""Which runtime a Trainer's later run continues from.

Lightning calls ``setup_environment`` at every run of a Trainer (``fit``, ``validate``, ``test``,
``predict``, ``fit`` again). A later run of the same Trainer on the same LightningModule goes on
from the state the earlier one left (``HeteroRuntime.continue_from``); a strategy object handed
to another Trainer, or the same Trainer fitting another model, starts afresh. Weak references: a
strategy must not keep a finished Trainer or model alive.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["Owner", "carried_runtime"]

Owner = tuple[weakref.ref, weakref.ref]


def carried_runtime(runtime: Any, owner: Owner | None, module: Any) -> tuple[Any, Owner | None]:
    """(the runtime this run continues from, or None; the owner to remember for the next run)."""
    now = (getattr(module, "_trainer", None), module)  # NOTE: `module.trainer` raises when detached
    same = owner is not None and all(ref() is obj for ref, obj in zip(owner, now))
    return (runtime if same else None), (None if None in now else (weakref.ref(now[0]), weakref.ref(now[1])))
