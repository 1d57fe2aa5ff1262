"""Let gloo release the last backward's state before the interpreter finalizes (docs/design.md, exit).

torch 2.14's ``backward()`` stashes a ``contextvars.Context`` in C++ thread-local state
(pytorch#173568), so every collective launched during backward (DDP's bucket all-reduce, FSDP2's
reduce-scatter) keeps a reference to it, which a gloo worker thread drops just after the work has
run. If that comes after the main thread began finalizing, dropping it needs the GIL, the thread is
ended under C++ code that may not unwind, and the process aborts: SIGABRT, "terminate called
without an active exception", after a training that succeeded. On a 2-core machine a 2-rank gloo
DDP job with a Python comm hook died so at exit in 1 of 25 to 6 of 22 runs
(benchmarks/bench_exit_abort.py).

:func:`note_backward_context`, called from inside backward (the runtime's comm hook, the FSDP2
loss), keeps the context that backward uses; an exit handler, run while the interpreter is still
whole, waits (sleeping, so the GIL is free) until nothing but itself holds it: every work launched
in the last backward is then gone. Bounded: after :data:`WAIT_S` it lets the exit go on.

:func:`exit_now` is for our own worker processes, whose results are written when ``main`` returns
and whose last backward may be a plain DDP baseline's (no hook of ours, nothing noted): they end
without finalizing at all.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from typing import Any, NoReturn

import torch

__all__ = ["WAIT_S", "exit_now", "note_backward_context", "still_held", "wait_for_release"]

WAIT_S = 3.0
_KEY = "context"  # torch.autograd.graph._engine_run_backward's key
_held: list[Any] = []  # the last backward's context, at most one
_log = logging.getLogger(__name__)


def note_backward_context() -> None:
    """Keep the context of the backward running now (no-op outside backward or on a torch without it)."""
    is_key = getattr(torch._C, "_is_key_in_tls", None)
    if is_key is None or not is_key(_KEY):
        return
    context = torch._C._get_obj_in_tls(_KEY)
    if _held and _held[0] is context:
        return
    if not _held:
        atexit.register(wait_for_release)  # at most once per process: _held is never emptied but here
    _held[:] = [context]


def still_held() -> bool:
    """Whether something besides this module holds the last noted context (a work still alive)."""
    # NOTE: 2 = the slot in _held and getrefcount's own argument; each work still alive holds one more
    return bool(_held) and sys.getrefcount(_held[0]) > 2


def wait_for_release(timeout_s: float = WAIT_S) -> bool:
    """Wait until no work holds the last noted context; True if none does (then or within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    try:
        while still_held():
            if time.monotonic() >= deadline:
                _log.debug("a collective still holds the last backward's context after %.1f s; exiting", timeout_s)
                return False
            time.sleep(0.001)
        return True
    finally:
        if _held:
            _held.clear()
            atexit.unregister(wait_for_release)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` now, its output flushed, without the interpreter's finalization
    (nor its exit handlers): what a worker does once its results are written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
