"""When Top-K pays: the measured link against the measured codec, per parameter.

Sending a parameter of n entries densely costs a ring all-reduce, ``4n / B`` seconds at the
measured all-reduce bandwidth B (payload bytes per second). Sending it sparse costs the codec's
work on every entry (error feedback, selection, residual) plus the all-gather of ``cap`` values
and indices from each of W ranks, ``4 cap W / B`` at the same bandwidth (an all-gather of p bytes
per rank moves as much per link as an all-reduce of ``p W / 2``). Top-K pays when::

    codec_s_per_entry * n + 4 * cap * W / B  <  4 * n / B

With indices shared by every rank (``topk_allreduce``) the sparse wire is one all-reduce of
``cap`` values and one broadcast of ``cap`` indices, ``1.5 cap`` in place of ``cap W``
(:func:`~hetero_strategy.cluster.wire.wire_entries`). The test itself is the cost model's
(:func:`~hetero_strategy.cluster.cost.sparse_pays`); this module measures its two inputs.

On a fast link (NVLink, loopback, a fast NIC next to a slow CPU) the codec alone is slower than
sending the entries, and the hook sends the parameter densely instead: asking for compression
where it does not pay costs nothing. Both figures are measured once, when the hook state is built,
and agreed over the group (the slowest rank's), so every rank takes the same decision.

Example::

    cost = measure_compression_cost(None, torch.device("cpu"), backend="auto")   # collective
    cost.sparse_pays(numel=1_000_000, capacity=10_000, world=2)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hetero_strategy.cluster.cost import Link, sparse_pays
from hetero_strategy.dist import measure_bandwidth_gbps
from hetero_strategy.hooks.codecs import TopKCodec, ef_accumulate_
from hetero_strategy.hooks.exchange import nonfinite_marker

__all__ = ["CodecWork", "CompressionCost", "measure_codec_seconds_per_entry", "measure_compression_cost"]

_PROBE_NUMEL = 1 << 20  # one probe bucket: large enough that per-call overheads amortise


@dataclass(frozen=True)
class CompressionCost:
    """Measured link and codec speed (identical on every rank of the group)."""

    link_bytes_per_s: float
    """Dense all-reduce bandwidth: payload bytes per second."""
    codec_s_per_entry: float
    """Seconds the compressing hook spends per bucket entry beyond a dense all-reduce."""

    def sparse_pays(self, numel: int, capacity: int, world: int, shared: bool = False) -> bool:
        """Whether sending ``capacity`` entries per rank beats a dense all-reduce of ``numel``
        (``shared``: at indices every rank shares, ``topk_allreduce``)."""
        return sparse_pays(numel, capacity, world, Link.from_allreduce(self.link_bytes_per_s, world),
                           self.codec_s_per_entry, shared)

    def describe(self) -> str:
        return (f"link {self.link_bytes_per_s * 8 / 1e9:.3g} Gbit/s, codec {self.codec_s_per_entry * 1e9:.3g} ns "
                f"per entry (dense costs {4e9 / self.link_bytes_per_s:.3g} ns per entry)")


class CodecWork:
    """The compressing hook's own work on a synthetic bucket of ``numel`` entries: error-feedback
    add, non-finite marker, per-parameter selection at ``density``, the residual write.

    :meth:`run` is one bucket's work, in place, as the hook does it on DDP's bucket; :meth:`reset`
    (outside any clock) puts the buffers back where they started. The probe times ``run`` beside
    the training step: a rank's codec time is part of its step cost (a rank held to a quarter of a
    core pays four times what a full core pays).
    """

    def __init__(self, numel: int, device: torch.device, backend: str = "auto", density: float = 0.05) -> None:
        gen = torch.Generator().manual_seed(0)
        self.grad = torch.randn(numel, generator=gen).to(device)
        self.buf = self.grad.clone()
        self.residual = torch.zeros(numel, device=device)
        parts = max(1, min(4, numel))  # a few parameters, as in a real bucket
        self.sizes = [numel // parts] * (parts - 1) + [numel - (numel // parts) * (parts - 1)]
        self.offsets = [sum(self.sizes[:i]) for i in range(parts)]
        self.ks = [max(1, int(n * density)) for n in self.sizes]
        self.backend = backend

    def reset(self) -> None:
        self.buf.copy_(self.grad)
        self.residual.zero_()

    def run(self) -> None:
        acc = ef_accumulate_(self.buf, self.residual, 1.0, self.backend)
        marker = nonfinite_marker(acc)
        TopKCodec.select_segments_(acc, self.offsets, self.sizes, self.ks, self.ks, self.backend)
        torch.where(torch.isnan(marker), self.residual, acc, out=self.residual)


def measure_codec_seconds_per_entry(device: torch.device, backend: str = "auto", density: float = 0.05,
                                    repeats: int = 3) -> float:
    """This rank's cost per entry of :meth:`CodecWork.run` on a 2^20-entry bucket (best of ``repeats``)."""
    work = CodecWork(_PROBE_NUMEL, device, backend, density)
    best = float("inf")
    for _ in range(repeats + 1):  # the first call warms caches and allocations up
        work.reset()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        work.run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best / _PROBE_NUMEL


def measure_compression_cost(process_group: dist.ProcessGroup | None, device: torch.device,
                             backend: str = "auto", density: float = 0.05) -> CompressionCost:
    """Link bandwidth and codec cost, the group's slowest (collective: every rank calls it).

    Decisions follow timings, so a parameter near the threshold may go whole in one run and sparse
    in another: use ``dense_fallback=False`` where runs must be bitwise reproducible.
    """
    codec = torch.tensor([measure_codec_seconds_per_entry(device, backend, density)], dtype=torch.float64,
                         device=device)
    dist.all_reduce(codec, op=dist.ReduceOp.MAX, group=process_group)
    # agreed inside (the slowest rank's time); 20 ms is enough to tell a fast link from a slow one
    gbps = measure_bandwidth_gbps(process_group, min_seconds=0.02)
    return CompressionCost(link_bytes_per_s=gbps * 1e9 / 8, codec_s_per_entry=float(codec.item()))
