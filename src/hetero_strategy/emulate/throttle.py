"""Simulated compute slowdown without root: a SIGSTOP/SIGCONT duty cycle on a rank's process group.

A rank with factor f runs ``f`` of every 100 ms period and is stopped for the rest, so CPU-bound
work really takes ~1/f as long (communication waits stretch too, which cgroup quotas would not do:
one reason the output says "simulated").
"""

from __future__ import annotations

import os
import signal
import threading
import time

from typing_extensions import Self

__all__ = ["DutyCycle"]

_PERIOD_S = 0.1


class DutyCycle:
    """Throttle the process group ``pgid`` to ``factor`` of wall time until :meth:`stop`.

    Example::

        proc = subprocess.Popen(cmd, start_new_session=True)
        with DutyCycle(proc.pid, 0.57):
            proc.wait(timeout=60)
    """

    def __init__(self, pgid: int, factor: float) -> None:
        self.pgid, self.factor = pgid, factor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"duty-cycle-{pgid}", daemon=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.factor < 1.0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * _PERIOD_S + 1)
        self._signal(signal.SIGCONT)  # never leave a rank stopped

    def _loop(self) -> None:
        run_s, pause_s = self.factor * _PERIOD_S, (1 - self.factor) * _PERIOD_S
        while not self._stop.wait(run_s):
            if not self._signal(signal.SIGSTOP):
                return
            time.sleep(pause_s)
            if not self._signal(signal.SIGCONT):
                return

    def _signal(self, sig: int) -> bool:
        try:
            os.killpg(self.pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
