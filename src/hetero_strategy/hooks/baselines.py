"""Baseline codecs, sample-weighted: fp16/bf16 casts and PyTorch's PowerSGD.

* :func:`cast_hook` — scale by b_r/G, cast to fp16 or bf16, all-reduce, cast back (half the bytes).
  Unlike PyTorch's ``fp16_compress_hook`` it weights by samples instead of dividing by world size.
* :func:`powersgd_weighted_hook` — PyTorch's ``powerSGD_hook`` (rank ``powersgd_rank``) with the
  bucket pre-scaled by ``b_r/G x world`` so its divide-by-world-size becomes the weighted mean.

NOTE (gloo): ``powerSGD_hook`` chains its second and third all-reduce in future callbacks. With
several buckets on gloo (torch 2.14.1) ranks then issue collectives in different orders and the
job aborts with a size mismatch; it works with one bucket (``bucket_cap_mb`` larger than the
model) or on NCCL. The benchmark runs it with a single bucket.

Example::

    state = CastState(dtype=torch.bfloat16)
    ddp_model.register_comm_hook(state, cast_hook)
"""

# NOTE: no `from __future__ import annotations`: DDP checks the hook's real annotation objects.
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as _psgd

from hetero_strategy.hooks import communicator as comm
from hetero_strategy.hooks.weighted import WeightedReduceState

__all__ = ["CastState", "PowerSGDBaselineState", "cast_hook", "powersgd_weighted_hook"]


class CastState(WeightedReduceState):
    """State of :func:`cast_hook`: the wire dtype plus byte accounting (``last_bytes_sent``)."""

    __slots__ = ["density", "dtype"]

    def __init__(self, process_group: "dist.ProcessGroup | None" = None, dtype: torch.dtype = torch.float16) -> None:
        super().__init__(process_group)
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtype={dtype} is invalid: choose torch.float16 or torch.bfloat16")
        self.dtype = dtype
        self.density = 1.0
        self._acc_sent = self.last_bytes_sent = self.last_bytes_received = 0

    def metrics(self) -> dict[str, float]:
        """Last step's communication, for a logger (same keys as CompressedState.metrics)."""
        return _metrics(self)


def cast_hook(state: CastState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: ``buffer *= b_r/G``, cast to ``state.dtype``, all-reduce, cast back.

    Example::

        ddp_model.register_comm_hook(CastState(dtype=torch.float16), cast_hook)
    """
    state.record_bucket(bucket)
    buf = bucket.buffer()  # (n,)
    wire = buf.mul_(state.weight).to(state.dtype)  # (n,) fp16/bf16; overflow shows as inf
    fut, sent = comm.all_reduce(wire, state.process_group)
    state._acc_sent += sent
    if bucket.is_last():
        state.last_bytes_sent = state.last_bytes_received = state._acc_sent
        state._acc_sent = 0
    return comm.then(fut, lambda: buf.copy_(wire))


class PowerSGDBaselineState(WeightedReduceState):
    """Wraps ``torch``'s ``PowerSGDState`` so the strategy can weight, log and checkpoint it."""

    __slots__ = ["density", "powersgd"]

    def __init__(self, process_group: "dist.ProcessGroup | None" = None, rank: int = 4,
                 start_iter: int = 2, warm_start: bool = True) -> None:
        super().__init__(process_group)
        self.powersgd = _psgd.PowerSGDState(process_group=process_group, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=start_iter, warm_start=warm_start,
                                            use_error_feedback=True, random_seed=0)
        self.density = 1.0
        self._acc_sent = self.last_bytes_sent = self.last_bytes_received = 0

    def metrics(self) -> dict[str, float]:
        """Last step's communication, for a logger (same keys as CompressedState.metrics)."""
        return _metrics(self)

    def state_dict(self) -> dict:
        out = super().state_dict()
        ps = self.powersgd
        out["powersgd"] = {
            "iter": ps.iter,
            "error_dict": {k: v.detach().cpu().clone() for k, v in ps.error_dict.items()},
            "p_memory_dict": {k: v.detach().cpu().clone() for k, v in ps.p_memory_dict.items()},
            "q_memory_dict": {k: v.detach().cpu().clone() for k, v in ps.q_memory_dict.items()},
        }
        return out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved = state.get("powersgd")
        if saved is None:
            return
        ps = self.powersgd
        ps.iter = int(saved["iter"])
        # NOTE: keyed by bucket index like upstream; tensors move to the bucket's device on first use
        for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
            getattr(ps, name).clear()
            getattr(ps, name).update(saved[name])


def powersgd_weighted_hook(state: PowerSGDBaselineState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's PowerSGD on a bucket pre-scaled to b_r/G x world (it divides by world size).

    Bytes: PowerSGD all-reduces its uncompressed tensors, then P, then Q; upstream counts those
    elements in ``total_numel_after_compression``, which gives the ring all-reduce bytes.
    """
    state.record_bucket(bucket)
    world = comm.world_size(state.process_group)
    buf = bucket.buffer()
    buf.mul_(state.weight * world)
    ps = state.powersgd
    _move_state(ps, bucket)
    before, dense = ps.total_numel_after_compression, ps.iter < ps.start_powerSGD_iter
    fut = _psgd.powerSGD_hook(ps, bucket)
    numel = buf.numel() if dense else ps.total_numel_after_compression - before
    state._acc_sent += 2 * (world - 1) * numel * buf.element_size() // world
    if bucket.is_last():
        state.last_bytes_sent = state.last_bytes_received = state._acc_sent
        state._acc_sent = 0
    return fut


def _metrics(state) -> dict[str, float]:
    return {"comm/bytes_sent": float(state.last_bytes_sent), "comm/bytes_received": float(state.last_bytes_received),
            "comm/density": float(state.density)}


def _move_state(ps: "_psgd.PowerSGDState", bucket: dist.GradBucket) -> None:
    """Put restored (CPU) PowerSGD memories on the bucket's device before the hook reads them."""
    device = bucket.buffer().device
    for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
        d = getattr(ps, name)
        for key, value in d.items():
            if value.device != device:
                d[key] = value.to(device)
