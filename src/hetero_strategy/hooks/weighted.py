"""Sample-weighted gradient reduction: reduced = sum_r b_r * g_r / G (docs/design.md semantics 3).

DDP's own reduction divides by the world size, which is wrong when ranks hold unequal batches:
each rank's gradient is of its *mean* loss, so it must count in proportion to its samples.
"""

# NOTE: no `from __future__ import annotations` here: DDP checks the hook's annotations are the
# real dist.GradBucket / torch.futures.Future objects, and string annotations fail that check.
import time

import torch
import torch.distributed as dist

from hetero_strategy.hooks import communicator as comm

__all__ = ["WeightedReduceState", "weighted_allreduce_hook"]


class WeightedReduceState:
    """State shared by all hetero hooks: this rank's reduction weight, step counter and timings.

    Call :meth:`set_local_batch` before each backward with this rank's sample count and the
    step's global batch (``HeteroStrategy`` does this from its sampler). Without a call the
    weight is 1/world_size, i.e. plain DDP averaging.

    Compression states subclass this one, so every hook weights the same way.
    """

    __slots__ = [
        # hyper-parameters
        "process_group",
        "overlap",
        # internal state
        "weight",
        "loss_scale",
        "_sample_weight",
        "step",
        "_deferred",
        "_acc_sent",
        # stats
        "last_hook_time",
        "last_hook_cpu",
        "last_bytes_sent",
        "last_bytes_received",
    ]

    def __init__(self, process_group: "dist.ProcessGroup | None" = None, overlap: bool = True) -> None:
        self.process_group = process_group
        # NOTE: overlap=False holds every bucket back until backward has finished. It pays when
        # communication competes with backward for the same compute (gloo on one pinned CPU core
        # per rank, as in the emulator): the all-reduce then runs while the rank would idle anyway.
        self.overlap = overlap
        self._deferred: list[tuple[torch.Tensor, torch.futures.Future]] = []
        world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self._sample_weight, self.loss_scale = 1.0 / world, 1.0
        self.weight = 1.0 / world
        self.step = 0
        self.last_hook_time: float | None = None
        self.last_hook_cpu: float | None = None  # this process's CPU seconds then (CPU buckets only)
        self._acc_sent = self.last_bytes_sent = self.last_bytes_received = 0  # wire bytes of the last step

    def set_local_batch(self, local_samples: int, global_samples: int) -> None:
        """Weight this rank's gradient by ``local_samples / global_samples`` (0 for padding)."""
        if global_samples <= 0 or not 0 <= local_samples <= global_samples:
            raise ValueError(f"local_samples={local_samples}, global_samples={global_samples} are invalid: "
                             "need 0 <= local_samples <= global_samples and global_samples > 0")
        self._sample_weight = local_samples / global_samples
        self.weight = self._sample_weight / self.loss_scale

    def set_loss_scale(self, scale: float) -> None:
        """This rank's loss scale (fp16 ranks; 1 elsewhere): its contribution is unscaled before the
        reduction, weight = b_r / (G * scale), so the reduced gradient is in true units everywhere."""
        if not scale > 0:
            raise ValueError(f"scale={scale!r} is invalid: a loss scale must be positive")
        self.loss_scale = float(scale)
        self.weight = self._sample_weight / self.loss_scale

    def record_bucket(self, bucket: dist.GradBucket) -> None:
        """Note when a bucket became ready; the last one marks the end of this rank's backward."""
        if bucket.is_last():
            self.last_hook_time = time.perf_counter()
            # NOTE: CPU time tells a CPU rank's own work from its waiting (gloo blocks without
            # spinning); on a GPU the host's CPU time measures neither
            self.last_hook_cpu = time.process_time() if bucket.buffer().device.type == "cpu" else None
            self.step += 1

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state.get("step", 0))


def weighted_allreduce_hook(
    state: WeightedReduceState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: scale the bucket by b_r / G, then sum across ranks.

    1. ``buffer *= weight`` (this rank's b_r / G for the step),
    2. ``all_reduce(SUM)`` asynchronously,
    3. the future's value is the reduced flat bucket, written back by DDP.

    Example::

        state = WeightedReduceState()
        ddp_model.register_comm_hook(state, weighted_allreduce_hook)
        for x, y in loader:
            state.set_local_batch(len(x), global_batch)
            loss_fn(ddp_model(x), y).backward()
    """
    state.record_bucket(bucket)
    tensor = bucket.buffer()  # (numel,) flat view of the bucket's gradients
    tensor.mul_(state.weight)
    if state.overlap:
        out = _all_reduce(state, tensor)
    else:
        # Deferred: answer with a placeholder; the last bucket's call issues every bucket's all-reduce
        # in bucket order (the same order on every rank, all from hook calls, none from callbacks).
        out = torch.futures.Future()
        state._deferred.append((tensor, out))
        if bucket.is_last():
            for buf, fut in state._deferred:
                _all_reduce(state, buf).then(lambda f, fut=fut: _forward(f, fut))
            state._deferred.clear()
    if bucket.is_last():
        state.last_bytes_sent = state.last_bytes_received = state._acc_sent  # ring: receives what it sends
        state._acc_sent = 0
    return out


def _all_reduce(state: WeightedReduceState, tensor: torch.Tensor) -> torch.futures.Future:
    fut, sent = comm.all_reduce(tensor, state.process_group)
    state._acc_sent += sent

    def reduced(f: torch.futures.Future) -> torch.Tensor:
        f.value()  # NOTE: re-raises a failed or timed-out all-reduce instead of handing DDP the local bucket
        return tensor

    return fut.then(reduced)


def _forward(done: torch.futures.Future, placeholder: torch.futures.Future) -> None:
    """Complete a deferred bucket's placeholder with the result, or with the error (never leave it pending)."""
    try:
        placeholder.set_result(done.value())
    except Exception as e:  # noqa: BLE001 - any failure must reach DDP, not hang it
        placeholder.set_exception(e)
