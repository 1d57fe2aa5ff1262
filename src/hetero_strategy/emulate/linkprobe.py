"""Measure a link's throughput with one TCP transfer (no torch import: starts in ~50 ms).

    python linkprobe.py sink HOST PORT COUNT   # prints "ready", then one line per transfer
    python linkprobe.py send HOST PORT BYTES   # prints Mbit/s measured by the sink

The sink times from the first to the last byte it receives, so connection set-up is excluded.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

__all__ = ["send", "sink"]

_TIMEOUT_S = 60.0


def sink(host: str, port: int, count: int) -> None:
    with socket.create_server((host, port), reuse_port=False) as srv:
        srv.settimeout(_TIMEOUT_S)
        print("ready", flush=True)
        for _ in range(count):
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(_TIMEOUT_S)
                (n,) = struct.unpack("!Q", _recv_exact(conn, 8))
                got, t0 = 0, None
                while got < n:
                    chunk = conn.recv(min(1 << 20, n - got))
                    if not chunk:
                        break
                    if t0 is None:
                        t0 = time.perf_counter()
                    got += len(chunk)
                dt = time.perf_counter() - (t0 or time.perf_counter())
                conn.sendall(struct.pack("!d", dt))
                print(f"{got} {dt:.6f}", flush=True)


def send(host: str, port: int, nbytes: int) -> float:
    """Send ``nbytes`` to the sink; returns the throughput in Mbit/s that the sink measured."""
    with socket.create_connection((host, port), timeout=_TIMEOUT_S) as conn:
        conn.sendall(struct.pack("!Q", nbytes))
        block = b"\0" * min(nbytes, 1 << 20)
        left = nbytes
        while left > 0:
            conn.sendall(block[: min(left, len(block))])
            left -= min(left, len(block))
        (dt,) = struct.unpack("!d", _recv_exact(conn, 8))
    return nbytes * 8 / max(dt, 1e-9) / 1e6


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("link probe: peer closed the connection early")
        buf += chunk
    return buf


if __name__ == "__main__":
    mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if mode == "sink":
        sink(host, port, n)
    else:
        print(f"{send(host, port, n):.3f}", flush=True)
