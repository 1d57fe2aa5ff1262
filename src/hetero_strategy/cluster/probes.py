"""Micro-benchmarks of one rank and of the links between ranks.

Compute probes (matmul throughput per dtype, memory bandwidth) run locally; communication probes
(all-reduce sweep, point-to-point matrix, small all-reduce latency) are collectives: every rank of
the default process group must call them in the same order. Iteration counts are agreed on with a
MAX all-reduce so no rank waits on a collective the others skipped.

Example::

    >>> matmul_tflops(torch.float32, torch.device("cpu"), n=64, budget_s=0.01) > 0
    True
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hetero_strategy.dist import allreduce_seconds

__all__ = ["allreduce_latency", "allreduce_sweep", "bus_bandwidth_factor", "matmul_tflops", "memory_gbps",
           "p2p_matrix", "sweep_sizes"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _sync(device: torch.device) -> None:
    # NOTE: a device-wide synchronize is what a probe wants: it times completed work, outside any hook.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_loop(fn, device: torch.device, budget_s: float, max_iters: int = 1000) -> float:
    """Seconds per call of fn: one warm-up, then calls until ``budget_s`` or ``max_iters``."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    iters = 0
    while iters < max_iters:
        fn()
        iters += 1
        if iters % 4 == 0 or device.type != "cuda":
            _sync(device)
            if time.perf_counter() - t0 >= budget_s:
                break
    _sync(device)
    return (time.perf_counter() - t0) / iters


def matmul_tflops(dtype: torch.dtype, device: torch.device, n: int = 1024, budget_s: float = 0.3) -> float:
    """Dense (n x n) @ (n x n) throughput in TFLOP/s (2 n^3 flops per product)."""
    a = torch.randn(n, n, device=device).to(dtype)  # (n, n)
    b = torch.randn(n, n, device=device).to(dtype)  # (n, n)
    return 2 * n**3 / _timed_loop(lambda: torch.mm(a, b), device, budget_s) / 1e12


def matmul_all(device: torch.device, n: int, budget_s: float) -> dict[str, float | None]:
    """TFLOP/s per dtype; None where the device cannot multiply in that dtype."""
    out: dict[str, float | None] = {}
    for name, dtype in _DTYPES.items():
        if device.type == "cuda" and name == "bf16" and not torch.cuda.is_bf16_supported():
            out[name] = None
            continue
        try:
            out[name] = matmul_tflops(dtype, device, n, budget_s)
        except RuntimeError:  # e.g. "addmm_impl_cpu_" not implemented for 'Half' on old CPU builds
            out[name] = None
    return out


def memory_gbps(device: torch.device, nbytes: int = 64 << 20, budget_s: float = 0.3) -> float:
    """Device memory bandwidth in GB/s from a large copy (read + write = 2x the bytes)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)  # (nbytes/4,)
    dst = torch.empty_like(src)
    return 2 * nbytes / _timed_loop(lambda: dst.copy_(src), device, budget_s) / 1e9


def sweep_sizes(min_bytes: int = 1 << 10, max_bytes: int = 256 << 20, factor: int = 4) -> list[int]:
    """1 KB, 4 KB, ... up to max_bytes (always including max_bytes), like nccl-tests' -f 4."""
    sizes, s = [], min_bytes
    while s < max_bytes:
        sizes.append(s)
        s *= factor
    sizes.append(max_bytes)
    return sizes


def bus_bandwidth_factor(world_size: int) -> float:
    """nccl-tests' all-reduce busbw = algbw * 2(n-1)/n: what each link carries in a ring."""
    return 2.0 * (world_size - 1) / world_size


def allreduce_sweep(sizes: list[int], budget_s: float = 0.3) -> list[dict[str, float]]:
    """Time, algbw and busbw (Gbit/s) of a sum all-reduce of each size (fp32 elements), each the
    slowest rank's mean over as many calls as fit in ``budget_s`` (at most 50; every rank runs the
    same count)."""
    n = dist.get_world_size()
    rows = []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        iters = max(1, min(50, int(budget_s / max(allreduce_seconds(numel), 1e-9))))
        dt = allreduce_seconds(numel, iters=iters)
        algbw = numel * 4 * 8 / dt / 1e9
        rows.append({"bytes": numel * 4, "time_s": dt, "algbw_gbit_s": algbw,
                     "busbw_gbit_s": algbw * bus_bandwidth_factor(n)})
    return rows


def p2p_matrix(device: torch.device, nbytes: int = 4 << 20) -> list[list[float | None]]:
    """Gbit/s from rank i to rank j (one transfer each, pairs in turn; the diagonal is None).

    Timed by the sender as a round trip: ``nbytes`` out, one element back.
    """
    n, me = dist.get_world_size(), dist.get_rank()
    big = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    ack = torch.zeros(1, device=device)
    row = torch.zeros(n, dtype=torch.float64, device=device)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            dist.barrier()
            if me == i:
                dist.send(ack, j)  # warm the connection so set-up is not timed
                dist.recv(ack, j)
                t0 = time.perf_counter()
                dist.send(big, j)
                dist.recv(ack, j)
                _sync(device)
                row[j] = big.numel() * 4 * 8 / (time.perf_counter() - t0) / 1e9
            elif me == j:
                dist.recv(ack, i)
                dist.send(ack, i)
                dist.recv(big, i)
                dist.send(ack, i)
    rows = [torch.zeros_like(row) for _ in range(n)]
    dist.all_gather(rows, row)
    return [[None if i == j else float(rows[i][j]) for j in range(n)] for i in range(n)]


def allreduce_latency(device: torch.device, iters: int = 200, nbytes: int = 4) -> dict[str, float]:
    """p50/p99/mean in microseconds of a tiny all-reduce, measured on this rank."""
    x = torch.ones(max(1, nbytes // 4), device=device)
    for _ in range(5):
        dist.all_reduce(x)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return {"bytes": x.numel() * 4, "iters": iters, "p50_us": times[len(times) // 2],
            "p99_us": times[min(len(times) - 1, int(0.99 * len(times)))], "mean_us": sum(times) / len(times)}
