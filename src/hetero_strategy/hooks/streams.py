"""A bucket's codec work on a side CUDA stream, so it overlaps the rest of backward.

DDP calls a comm hook on the stream that wrote the bucket's gradients (the compute stream), and
codec kernels queued there hold back the backward kernels queued behind them. With
``side_streams=True`` the hook instead:

1. makes its side stream wait for the compute stream (an event: the gradients are written);
2. runs the codec, the collectives' issue and the decode with the side stream current (NCCL's
   own stream waits for the side stream when a collective is issued);
3. returns a CUDA future completed on the side stream, so DDP's ``wait()`` makes the compute
   stream wait for the decode: events only, no host sync and no device-wide synchronize.

Memory: tensors made while the side stream is current come from its pool and are used there; the
result handed to DDP is recorded on the stream that waits for it (CUDA futures record their
tensors on the waiting stream), and NCCL records its inputs on its stream. The bucket buffer and
the residuals live as long as the model, so no ``record_stream`` is needed for them.

On the CPU (gloo) there are no streams: the hook runs as it is.

NOTE: written without a GPU to run it on; ``benchmarks/gpu_check.py`` compares it bitwise with
the plain path and times it. Until that has run, ``side_streams`` is off by default.

Example::

    streams = SideStreams()
    fut = streams.run(bucket.buffer(), lambda: topk_exchange(state, bucket))
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["SideStreams"]


class SideStreams:
    """One side stream per CUDA device, made at first use."""

    def __init__(self) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}

    def run(self, buffer: torch.Tensor, work: Callable[[], torch.futures.Future]) -> torch.futures.Future:
        """``work()`` (a hook's body) on the side stream of ``buffer``'s device; its future, made
        safe for DDP to wait on from the compute stream."""
        if buffer.device.type != "cuda":
            return work()
        device = buffer.device
        side = self._streams.get(device.index)
        if side is None:
            side = self._streams[device.index] = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            inner = work()
        result: torch.futures.Future = torch.futures.Future(devices=[device])

        def complete(fut: torch.futures.Future) -> None:
            # the inner chain may end in a future without devices (collect_all's): complete ours
            # with the side stream current, so its events follow every kernel the hook queued
            with torch.cuda.stream(side):
                try:
                    value = fut.wait()  # a CUDA future: the side stream waits for its events
                except Exception as e:  # noqa: BLE001 - NOTE: handed to DDP, which raises it
                    result.set_exception(e)
                    return
                result.set_result(value)

        inner.add_done_callback(complete)
        return result
