"""A bucket's codec work on a side CUDA stream, so it overlaps the rest of backward.

DDP calls a comm hook on the stream that wrote the bucket's gradients (the compute stream), and
codec kernels queued there hold back the backward kernels queued behind them. With
``side_streams=True`` the hook instead:

1. makes its side stream wait for the compute stream (an event: the gradients are written);
2. runs the codec, the collectives' issue and the Top-K decode with the side stream current
   (NCCL's stream waits for the side stream when a collective is issued; a decode that is a
   callback of a CUDA future, as onebit's and the dense all-reduce's, runs on a pool stream that
   waits for NCCL, and the side stream then waits for that);
3. returns a CUDA future completed on the side stream, so DDP's ``wait()`` makes the compute
   stream wait for the decode: events only, no host sync and no device-wide synchronize.

Memory: tensors made while the side stream is current come from its pool and are used there; the
result handed to DDP is recorded on the stream that waits for it (CUDA futures record their
tensors on the waiting stream), and NCCL keeps its inputs alive until the collective is done. The
bucket buffer and the residuals live as long as the model, so no ``record_stream`` is needed for
them.

On the CPU (gloo) there are no streams: the hook runs as it is.

NOTE: written without a GPU to run it on; ``benchmarks/gpu_check.py`` compares it bitwise with
the plain path and times it. Until that has run, ``side_streams`` is off by default.

Example::

    streams = SideStreams(enabled=config.side_streams)
    fut = streams.run(bucket.buffer(), lambda: topk_exchange(state, bucket))
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["SideStreams"]


class SideStreams:
    """One side stream per CUDA device, made at first use; ``enabled=False`` (the default of
    ``side_streams``) runs every hook body as it is."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._streams: dict[int, torch.cuda.Stream] = {}

    def run(self, buffer: torch.Tensor, work: Callable[[], torch.futures.Future]) -> torch.futures.Future:
        """``work()`` (a hook's body) on the side stream of ``buffer``'s device; its future, made
        safe for DDP to wait on from the compute stream."""
        if not self.enabled or buffer.device.type != "cuda":
            return work()
        device = buffer.device
        side = self._streams.get(device.index)
        if side is None:
            side = self._streams[device.index] = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        result: torch.futures.Future = torch.futures.Future(devices=[device])
        with torch.cuda.stream(side):
            inner = work()
            # NOTE: NCCL completes a collective's future when it is queued, so the hook's whole
            # chain of callbacks has run by now; a backend that completes later would run them on
            # another thread and stream, which nothing here would order
            if not inner.done():
                raise RuntimeError("side_streams=True needs a backend whose collectives complete when queued "
                                   f"(NCCL), not {dist.get_backend()!r}: set side_streams=False")
            # wait(): the side stream waits for the chain's last events (callbacks of CUDA futures
            # run on pool streams) and the hook's own error is raised here, whole; the result's
            # event is then recorded on the side stream, after every kernel the hook queued
            result.set_result(inner.wait())
        return result
