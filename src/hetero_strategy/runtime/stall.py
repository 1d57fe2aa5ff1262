"""A silent peer becomes a clear error within a bound (docs/design.md semantics 11).

Two parts:

* **The bound.** Inside a phase of a training step (forward, the gradient exchange in backward,
  metrics, the checkpoint gather), the default process group and the hook's own groups wait at
  most ``stall_timeout_s`` in any collective (:func:`bounded`), whatever timeout the framework
  created them with (30 minutes in Lightning and Accelerate). Elsewhere (rendezvous, the start-up
  probe, evaluation, checkpoint barriers) the framework's timeout stays: a slow rank may
  legitimately be far behind there.
* **The diagnosis.** Each rank beats a counter in the rendezvous store from a thread of its own
  (:class:`StallWatch`). The thread of a frozen process is frozen too, so when a collective fails
  the survivors read which counters stopped: that names the silent rank. The error also names the
  phase (forward, exchange, metrics, checkpoint) and the step.

The heartbeat uses a client connection of its own to ``MASTER_ADDR:MASTER_PORT`` with a short
timeout, so a frozen store host (rank 0 under a one-node launch) cannot hang the diagnosis.

Example::

    watch = StallWatch(rank, world, timeout_s=60.0)
    with watch.phase("exchange", step):          # at most 60 s per collective; a failure: StallError
        loss.backward()
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.dist import StallError, client_store, is_peer_failure, is_peer_gone

__all__ = ["StallWatch", "bounded", "group_timeout", "hook_groups"]

def group_timeout(group: dist.ProcessGroup) -> datetime.timedelta | None:
    """The timeout ``group`` was created with (None when the backend does not say)."""
    for device in ("cpu", "cuda"):
        try:  # NOTE: private, but the only place the backend keeps it; None falls back to not restoring
            return group._get_backend(torch.device(device)).options._timeout
        except Exception:  # noqa: BLE001, S112 - that device has no backend here
            continue
    return None


@contextlib.contextmanager
def bounded(timeout_s: float, groups: Iterable[dist.ProcessGroup | None] = ()) -> Iterator[None]:
    """Inside the block, collectives of the default group and ``groups`` wait at most ``timeout_s``;
    each group gets its own timeout back afterwards (the probe, evaluation and checkpoint barriers
    keep the framework's: a slow rank may legitimately be far behind there)."""
    if not dist.is_initialized():
        yield
        return
    bound = datetime.timedelta(seconds=timeout_s)
    chosen = list({id(g): g for g in (dist.group.WORLD, *groups) if g is not None}.values())
    saved = [(g, group_timeout(g)) for g in chosen]
    for g, _ in saved:
        g.set_timeout(bound)
    try:
        yield
    finally:
        for g, before in saved:
            if before is not None:
                g.set_timeout(before)


def hook_groups(state: Any) -> list[dist.ProcessGroup]:
    """The process groups a comm hook's state exchanges over (its own, its leaders', its node's)."""
    hier = getattr(state, "hier", None)
    found = [getattr(state, "process_group", None), getattr(state, "exchange_group", None),
             getattr(hier, "intra", None), getattr(hier, "cross", None)]
    return [g for g in found if isinstance(g, dist.ProcessGroup)]


class StallWatch:
    """This rank's heartbeat, its current phase and step, and the error a failed collective becomes."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, *, period_s: float | None = None,
                 groups: Iterable[dist.ProcessGroup] = ()) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.groups = list(groups)  # bounded inside a phase, with the default group
        self.period_s = period_s if period_s is not None else min(1.0, timeout_s / 4)
        self.where, self.step = "setup", 0
        self._stop = threading.Event()
        self._store = client_store(min(5.0, timeout_s), "heartbeat")
        self._thread: threading.Thread | None = None
        if self._store is not None and world_size > 1:
            self._thread = threading.Thread(target=self._beat, name="hetero-heartbeat", daemon=True)
            self._thread.start()
            atexit.register(self.close)  # the thread and its store connection end before interpreter teardown

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.period_s + 5)
            self._thread = None
        self._store = None

    @contextlib.contextmanager
    def phase(self, where: str, step: int | None = None) -> Iterator[None]:
        """Run the block as ``where`` of ``step``; a collective failing in it raises :class:`StallError`."""
        self.where, self.step = where, self.step if step is None else step
        try:
            with bounded(self.timeout_s, self.groups):
                yield
        except Exception as e:
            if not is_peer_failure(e):
                raise
            raise self.error(e) from e

    def error(self, cause: BaseException) -> StallError:
        """The :class:`StallError` for ``cause``, with the silent rank(s) when the heartbeats tell."""
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        gone = is_peer_gone(text)
        what = "lost its connection to" if gone else f"waited more than stall_timeout_s={self.timeout_s:g} s for"
        return StallError(f"hetero: rank {self.rank} {what} {self._who()} during the {self.where} of step "
                          f"{self.step} ({text[:300]}). A frozen or dead peer stops every rank; if that peer is "
                          "only slow here (a long evaluation or checkpoint on one rank), raise stall_timeout_s")

    # ---- the heartbeat -------------------------------------------------------------------
    def _beat(self) -> None:
        key = str(self.rank)
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(Exception):  # a silent store is diagnosed by the readers
                self._store.add(key, 1)

    def _counts(self) -> list[int]:
        return [self._store.add(str(r), 0) for r in range(self.world_size)]

    def _who(self) -> str:
        if self._store is None or self.world_size < 2:
            return "a peer" if self.world_size != 2 else f"rank {1 - self.rank}"
        try:
            first = self._counts()
            time.sleep(3 * self.period_s)  # every live rank beats at least twice meanwhile
            second = self._counts()
        except Exception:  # noqa: BLE001 - the store itself is silent: say so
            host = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            return (f"a peer (the rendezvous store at {host} does not answer either: its host, rank 0 under a "
                    "one-node launch, is likely the silent one)")
        silent = [r for r in range(self.world_size) if r != self.rank and second[r] == first[r]]
        if not silent:
            return "a peer (every heartbeat still moves: the peer is alive but stuck in its own code)"
        return ("rank " if len(silent) == 1 else "ranks ") + ", ".join(map(str, silent))
