"""When a periodic checkpoint is due: the same answer on every rank, after every optimizer step.

Step-based saves need nothing shared. For time-based ones rank 0's clock decides, and the step
is agreed through the job's rendezvous store, two steps ahead, so no collective is added per
step. No rank can finish step s + 1 before rank 0 finished step s (its exchange needs rank 0's
gradient), so every rank reads the key in time.
"""

from __future__ import annotations

import time

from hetero_strategy.dist import job_store

__all__ = ["SaveSchedule"]



class SaveSchedule:
    def __init__(self, rank: int, every_steps: int | None, every_s: float | None, distributed: bool) -> None:
        self.rank, self.every_steps, self.every_s = rank, every_steps, every_s
        self._store = None
        if distributed and every_s is not None:  # every rank builds its checkpointers in the same order
            self._store = job_store("ckpt")
        self._last = time.monotonic()
        self._announced: int | None = None
        self._polled = -1  # the last step this rank was asked about (time-based saves)
        self._timed = 0

    def saved(self) -> None:
        self._last = time.monotonic()

    def due(self, steps: int) -> bool:
        by_steps = self.every_steps is not None and steps > 0 and steps % self.every_steps == 0
        return self._time_due(steps) or by_steps

    def _time_due(self, steps: int) -> bool:
        if self.every_s is None:
            return False
        elapsed = time.monotonic() - self._last >= self.every_s
        if self._store is None:
            return elapsed
        key = str(self._timed)
        if self.rank == 0 and self._announced is None and elapsed:
            self._announced = steps + 2
            self._store.set(key, str(self._announced))
        if self._announced is None and self._store.check([key]):
            self._announced = int(self._store.get(key))
        # NOTE: a step past the announced one is a disagreement only if this rank was asked at the
        # announced one and did not know yet; hybrid training skips points alike on every rank
        # (the syncs inside join() are never polled), and then saves at the next one it is asked at
        if self._announced is not None and steps > self._announced and self._polled >= self._announced:
            raise RuntimeError(f"hetero: rank {self.rank} learned of the checkpoint at step {self._announced} "
                               f"only after step {steps}: the ranks no longer agree on when to save")
        self._polled = steps
        if self._announced is None or steps < self._announced:
            return False
        self._announced = None
        self._timed += 1
        return True

    def close(self) -> None:
        self._store = None

