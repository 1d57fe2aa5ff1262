"""Measure a link's throughput with one TCP transfer (no torch import: starts in ~50 ms).

    python linkprobe.py sink HOST PORT COUNT   # prints "ready", then one line per transfer
    python linkprobe.py send HOST PORT BYTES   # prints Mbit/s measured by the sink

The sink times from the first to the last byte it receives, so connection set-up is excluded.
:func:`measure_uploads` drives both ends for an emulated cluster: a sink in the bridge namespace,
one sender at a time in each rank's namespace.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["measure_uploads", "send", "sink"]

_TIMEOUT_S = 60.0
_PROBE_PORT = 5999


def measure_uploads(bridge_netns: str, sink_addr: str, rates_bps: Mapping[int, float | None],
                    run_in: Callable[[int, list[str]], subprocess.CompletedProcess]) -> dict[int, float]:
    """Upload throughput (Mbit/s) of each sending rank to a sink in ``bridge_netns``, one at a time.

    Args:
        bridge_netns: the namespace the sink runs in (the cluster's bridge).
        sink_addr: the sink's address on the bridge.
        rates_bps: rank -> its configured rate (None: unshaped), which sizes a transfer of ~0.4 s.
        run_in: ``run_in(rank, argv)`` runs ``argv`` in the rank's namespace and returns its result.
    """
    # NOTE: imported here: this file also runs as a bare script (sink/send), where importing the
    # package would import Lightning (seconds); for the same reason the file runs, not `-m ...`.
    from hetero_strategy.emulate.system import EmulatorError

    py = [sys.executable, str(Path(__file__))]
    sink_proc = subprocess.Popen(["ip", "netns", "exec", bridge_netns, *py, "sink", sink_addr, str(_PROBE_PORT),
                                  str(len(rates_bps))], stdout=subprocess.PIPE, text=True)
    try:
        if sink_proc.stdout.readline().strip() != "ready":
            raise EmulatorError("link probe sink did not start in the bridge namespace")
        measured = {}
        for rank, rate in rates_bps.items():
            nbytes = 16 << 20 if rate is None else int(min(max(rate / 8 * 0.4, 1 << 20), 32 << 20))
            res = run_in(rank, [*py, "send", sink_addr, str(_PROBE_PORT), str(nbytes)])
            if res.returncode != 0:
                raise EmulatorError(f"link probe of rank {rank} failed: {res.stderr.strip()[-500:]}")
            measured[rank] = float(res.stdout.split()[-1])
        return measured
    finally:
        sink_proc.kill()
        sink_proc.wait(timeout=5)


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
