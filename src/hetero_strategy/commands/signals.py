"""SIGTERM, SIGINT and SIGHUP end every command alike: its ranks stop, what it built is removed.

The handler turns the signal into an exception in the main thread (``KeyboardInterrupt`` for
Ctrl-C, ``SystemExit(128 + signal)`` otherwise), so every ``with EmulatedCluster(...)`` and
``finally`` on the way out runs. It also tells a running rank supervisor, whose watch loop
raises it again if CPython dropped the first one (see ``emulate/launch.py``). A SIGKILL of the
command cannot be caught: its ranks die with it (``PR_SET_PDEATHSIG``), and the namespaces and
cgroups it left are removed as stale by the next ``emulate``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

__all__ = ["STOP_SIGNALS", "stopping_on_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    previous = {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _on_signal(signum: int, frame: object) -> None:
    from hetero_strategy.emulate.launch import request_stop

    request_stop(signum)
    for sig in STOP_SIGNALS:  # one is enough: a second one would break off the clean-up it started
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(128 + signum)
