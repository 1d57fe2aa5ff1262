"""A free TCP port on loopback, for a job's rendezvous (the wizard's profiler, the emulator, benchmarks)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the OS picks it; a race with another binder remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
