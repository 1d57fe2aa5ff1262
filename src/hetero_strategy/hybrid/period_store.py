"""The end of a local-SGD period, agreed through the job's rendezvous store (no collective).

Keys of period p, under the hybrid controller's own prefix (:func:`job_store`):

* ``p/<rank>``: the rank's local steps so far this period (it adds to it after each step);
* ``p/go``: set by the first rank that reached the period H itself, or that leads a peer by
  ``max_staleness`` steps; every rank checks it after each of its steps and syncs once it is set;
* ``p/in<rank>``: after a restore, set once the rank's resumed count is in ``p/<rank>``
  (:meth:`PeriodStore.arrive`: no rank looks at a peer's counter before every rank's is there).

A rank whose data ran out waits here for an active rank to end the period; a peer whose counter
stops moving for ``stall_timeout_s`` is an error, not a hang.

Example::

    board = PeriodStore(rank, world_size, stall_timeout_s=60)
    board.publish(period, count)                  # after each local step
    if count >= H or count - board.slowest(period, peers) >= tau:
        board.end(period)
    if board.ended(period): ...                   # the sync (collective)
    board.clear(period)                           # after the sync
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from hetero_strategy.dist import StallError, job_store

__all__ = ["PeriodStore"]


class PeriodStore:
    """This rank's counter and the period's flag in the store (build it on every rank, in order)."""

    def __init__(self, rank: int, world_size: int, stall_timeout_s: float = 60.0) -> None:
        self.rank, self.world_size, self.stall_timeout_s = rank, world_size, stall_timeout_s
        self.store = job_store("hybrid")
        self.published = 0  # of this rank's steps this period, what its counter holds

    def publish(self, period: int, count: int) -> None:
        """This rank took ``count`` local steps so far in ``period`` (a resumed count too)."""
        if count > self.published:
            self.store.add(self._key(period, self.rank), count - self.published)
            self.published = count

    def arrive(self, period: int, count: int) -> None:
        """After a restore, before this rank's first local step (or join): publish its resumed
        ``count``, then wait until every rank did (a store barrier, once per restore; every rank
        restores alike). Without it a peer that already stepped could read this counter before
        the resumed count is in it, take it for 0 and end the period early by the staleness bound."""
        self.publish(period, count)
        self.store.set(self._key(period, f"in{self.rank}"), "1")
        keys = [self._key(period, f"in{r}") for r in range(self.world_size)]
        since = time.monotonic()
        while not self.store.check(keys):
            if time.monotonic() - since > self.stall_timeout_s:
                missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
                raise StallError(f"hetero: rank {self.rank} resumed and waited more than stall_timeout_s="
                                 f"{self.stall_timeout_s:g} s for rank(s) {missing} to resume period {period} "
                                 "(their first local step after the restore); they are frozen or gone, or "
                                 "did not load the same checkpoint")
            time.sleep(0.01)

    def steps_of(self, period: int, rank: int) -> int:
        # NOTE: add(key, 0) reads a peer's counter without waiting for it to exist
        return self.store.add(self._key(period, rank), 0)

    def end(self, period: int) -> None:
        self.store.set(self._key(period, "go"), "1")

    def ended(self, period: int) -> bool:
        return self.store.check([self._key(period, "go")])

    def wait_for_end(self, period: int, active: list[int]) -> None:
        """Wait for one of the ``active`` ranks to end ``period``; raise if they all stopped stepping."""
        seen, since = None, time.monotonic()
        while not self.ended(period):
            counts = [self.steps_of(period, r) for r in active]
            if counts != seen:
                seen, since = counts, time.monotonic()
            elif time.monotonic() - since > self.stall_timeout_s:
                raise StallError(f"hetero: rank {self.rank} joined (no data left) and waited more than "
                                 f"stall_timeout_s={self.stall_timeout_s:g} s for rank(s) {active} to take a local "
                                 f"step in period {period}; they are frozen or gone")
            time.sleep(0.01)

    def clear(self, period: int) -> None:
        """After the period's sync: nobody reads its keys again; the next period starts at 0."""
        self.published = 0
        # NOTE: a store without delete keeps them (they are under this period's number only)
        with contextlib.suppress(Exception):
            self.store.delete_key(self._key(period, self.rank))
            if self.rank == 0:
                self.store.delete_key(self._key(period, "go"))
            self.store.delete_key(self._key(period, f"in{self.rank}"))  # if it restored in this period

    @staticmethod
    def _key(period: int, name: Any) -> str:
        return f"{period}/{name}"
