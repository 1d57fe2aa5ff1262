"""Compressors (GRACE's "Compressor" role): turn a flat fp32 gradient into a payload and back.

* :class:`TopKCodec` — the k largest-magnitude entries as fp32 values + int32 indices, packed into
  one fp32 buffer of fixed capacity (indices bit-cast), so one all-gather moves both.
* :class:`SignCodec` — 1 bit per entry (packed 8 per byte) plus one fp32 scale (mean |x|).
* :func:`cast_payload` — fp16/bf16 cast for a dense all-reduce.

The Top-K inner loops go through ``hetero_strategy.triton_kernels.dispatch`` when it is installed
(Triton on GPU, torch elsewhere); the torch code below is the fallback and the reference.

Example::

    acc = torch.randn(1000)
    payload, residual = TopKCodec.compress(acc, k=10, capacity=16)  # (32,) fp32, (1000,) fp32
    dense = TopKCodec.decompress(payload.view(1, -1), numel=1000)   # (1000,), 10 non-zeros
    assert torch.equal(dense + residual, acc)
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

try:  # NOTE: written in parallel by the kernels work; the torch fallback keeps us working without it
    from hetero_strategy.triton_kernels import dispatch as _dispatch
except ImportError:  # pragma: no cover - depends on the install
    _dispatch = None

__all__ = ["SignCodec", "TopKCodec", "cast_payload", "ef_accumulate", "ef_accumulate_"]


def _use_dispatch(backend: str, name: str, tensor: torch.Tensor | None = None) -> bool:
    """Whether ``name`` runs through the kernels' dispatcher: only where it would pick Triton.

    On other tensors (CPU, or CUDA without Triton) the in-place torch code below is used: it does
    fewer passes than the dispatcher's reference, which is written for clarity.
    """
    if backend == "torch":
        return False
    available = _dispatch is not None and hasattr(_dispatch, name)
    if not available:
        if backend == "triton":
            raise RuntimeError(f"compression_backend='triton' is invalid here: hetero_strategy.triton_kernels."
                               f"dispatch.{name} is not installed; use compression_backend='auto' or 'torch'")
        return False
    return tensor is None or _dispatch.backend_for(tensor, backend) == "triton"


def ef_accumulate(grad: torch.Tensor, residual: torch.Tensor | None, gamma: float,
                  backend: str = "auto") -> torch.Tensor:
    """acc = grad + gamma * residual in fp32 (a new tensor; ``grad`` is not modified)."""
    if residual is None:
        return grad.to(torch.float32, copy=True)
    if _use_dispatch(backend, "ef_accumulate", grad):
        return _dispatch.ef_accumulate(grad, residual, gamma, backend=backend)
    return torch.add(grad.to(torch.float32), residual, alpha=gamma)


def ef_accumulate_(buf: torch.Tensor, residual: torch.Tensor, gamma: float, backend: str = "auto") -> torch.Tensor:
    """acc = buf + gamma * residual, written into ``buf`` when it is fp32 (no new (n,) tensor)."""
    if buf.dtype != torch.float32 or _use_dispatch(backend, "ef_accumulate", buf):
        return ef_accumulate(buf, residual, gamma, backend)
    return buf.add_(residual, alpha=gamma)


_SAMPLER = torch.Generator()


def _threshold_indices(mag: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending indices of the k largest entries of ``mag`` (CPU; ~1 pass for small k/n).

    A random sample gives a threshold a little below the k-th largest value; the exact top-k is
    then taken among the few candidates above it. If the sample overshoots (fewer than k
    candidates) the exact k-th value is used instead.
    """
    n = mag.numel()
    if n > (1 << 16) and k * 20 < n:
        # NOTE: a random (fixed-seed, so reruns select alike) sample, not a strided one: a stride
        # that is a multiple of the kernel size samples one kernel position only (e.g. ResNet's
        # layer4 at 32x32 input, where 8 of 9 positions have exactly zero gradient)
        picks = torch.randint(n, (8192,), generator=_SAMPLER.manual_seed(n))  # (8192,) int64
        sample = mag[picks]  # (8192,)
        want = min(sample.numel(), max(2, math.ceil(2 * k * sample.numel() / n)))  # 2x margin
        threshold = torch.topk(sample, want, sorted=False).values.min()
        cand = (mag >= threshold).nonzero().squeeze(1)  # (>=k usually,) ascending
        if cand.numel() >= k:
            return _ties_to_lower_index(cand, mag[cand], k)
    threshold = mag.kthvalue(n - k + 1).values  # k-th largest magnitude
    cand = (mag >= threshold).nonzero().squeeze(1)  # (>=k,) ascending
    # NOTE: not cand[:k]: that would drop entries above the threshold for tied ones at lower indices
    return _ties_to_lower_index(cand, mag[cand], k)


def _ties_to_lower_index(cand: torch.Tensor, mag: torch.Tensor, k: int) -> torch.Tensor:
    """The k of ``cand`` (ascending indices) with the largest ``mag``, ties at the k-th value to the
    lower index: the kernels' rule, so CPU and GPU runs select the same entries."""
    kth = torch.topk(mag, k, sorted=False).values.min()
    above = mag > kth  # (c,)
    tied = (mag == kth).nonzero().squeeze(1)[: k - int(above.sum())]  # lowest indices first
    keep = above.clone()
    keep[tied] = True
    return cand[keep]


def _topk_select_torch_(acc: torch.Tensor, k: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (capacity,), indices (capacity,) int32); the sent entries of ``acc`` are zeroed in place.

    Exactly k entries of largest |acc|. On CPU a sampled threshold + nonzero is several times
    faster than torch.topk over the whole tensor.
    """
    values = torch.zeros(capacity, dtype=torch.float32, device=acc.device)
    indices = torch.zeros(capacity, dtype=torch.int32, device=acc.device)
    if k == 0:
        return values, indices
    mag = acc.abs()  # (n,)
    if acc.is_cuda or k == acc.numel():
        idx = torch.topk(mag, k, sorted=False).indices.sort().values  # (k,) int64
    else:
        # NOTE: NaN compares false, so a non-finite acc may select fewer than k; the hook marks
        # such a bucket non-finite anyway (see compressed.py)
        idx = _threshold_indices(mag, k)  # (<=k,) int64, ascending
    m = idx.numel()
    values[:m] = acc[idx]
    indices[:m] = idx.to(torch.int32)
    acc[idx] = 0.0
    return values, indices


class TopKCodec:
    """Top-K sparsification with a fixed-capacity payload (padding: value 0 at index 0)."""

    @staticmethod
    def payload_numel(capacity: int) -> int:
        return 2 * capacity  # fp32 values then int32 indices bit-cast to fp32

    @staticmethod
    def select_(acc: torch.Tensor, k: int, capacity: int, backend: str = "auto"):
        """(values (capacity,) fp32, indices (capacity,) int32); zeroes the k sent entries of acc in place."""
        assert acc.dtype == torch.float32 and acc.dim() == 1, "acc must be a flat fp32 tensor"
        assert 0 <= k <= min(capacity, acc.numel()), f"need 0 <= k={k} <= capacity={capacity}, numel"
        if _use_dispatch(backend, "topk_select", acc):
            values, indices, _count, residual = _dispatch.topk_select(acc, k, capacity, backend=backend)
            acc.copy_(residual)
            return values, indices
        return _topk_select_torch_(acc, k, capacity)

    @staticmethod
    def pack(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """One fp32 payload (2*capacity,): values, then the int32 indices bit-cast (no arithmetic on them)."""
        return torch.cat([values, indices.view(torch.float32)])

    @classmethod
    def compress(cls, acc: torch.Tensor, k: int, capacity: int, backend: str = "auto"):
        """Payload (2*capacity,) fp32 and the new residual (acc with the sent entries zeroed)."""
        residual = acc.clone()
        values, indices = cls.select_(residual, k, capacity, backend)
        return cls.pack(values, indices), residual

    @staticmethod
    def decompress(gathered: torch.Tensor, numel: int, backend: str = "auto",
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """Sum of every rank's sparse payload: gathered (R, 2*capacity) -> dense (numel,) fp32
        (added into ``out`` when given).

        Ranks are added one after another: within one rank the indices are distinct (padding adds
        0.0), so the result is the same on every rank and every device (no atomics race).
        """
        capacity = gathered.shape[1] // 2
        if out is None:
            out = torch.zeros(numel, dtype=torch.float32, device=gathered.device)
        if _use_dispatch(backend, "scatter_add", out):  # same contract: row by row, deterministic
            indices = gathered[:, capacity:].contiguous().view(torch.int32)  # (R, capacity)
            return _dispatch.scatter_add(out, gathered[:, :capacity].contiguous(), indices, backend=backend)
        for row in gathered:  # (2*capacity,) per rank
            idx = row[capacity:].contiguous().view(torch.int32).long()  # (capacity,)
            out.index_add_(0, idx, row[:capacity])
        return out


@lru_cache(maxsize=256)
def _device_constants(sizes: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment sizes (S,) int64, bit weights (8,) uint8) on ``device``, built once per bucket layout.

    NOTE: built per call, both were a blocking host-to-device copy per bucket and step on CUDA.
    """
    return (torch.tensor(sizes, dtype=torch.int64, device=device),
            torch.tensor(SignCodec._BITS, dtype=torch.uint8, device=device))


class SignCodec:
    """1-bit sign compression with one scale (mean |acc|) per segment (parameter), signSGD-style.

    Scales per parameter, not per bucket, so the result does not depend on DDP's bucket layout.
    """

    _BITS = (1, 2, 4, 8, 16, 32, 64, 128)

    @staticmethod
    def payload_numel(numel: int, segments: int = 1) -> int:
        return (numel + 7) // 8 + 4 * segments  # packed sign bytes + fp32 scales as bytes

    @classmethod
    def compress(cls, acc: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Payload (uint8: ceil(n/8) sign bytes + 4 bytes per segment) and residual = acc - scale*sign."""
        n = acc.numel()
        sizes_t, weights = _device_constants(tuple(sizes), acc.device)
        scales = torch.stack([seg.abs().mean() for seg in acc.split(sizes)])  # (S,) fp32; NaN if one is
        positive = acc >= 0  # (n,) bool
        signs = positive.to(torch.float32).mul_(2.0).sub_(1.0)  # (n,) in {-1, +1}
        # output_size: without it repeat_interleave reads the total back from the device (a sync)
        residual = acc - torch.repeat_interleave(scales, sizes_t, output_size=n) * signs
        padded = torch.zeros((n + 7) // 8 * 8, dtype=torch.uint8, device=acc.device)
        padded[:n] = positive.to(torch.uint8)
        packed = (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)  # (ceil(n/8),)
        return torch.cat([packed, scales.view(torch.uint8)]), residual

    @classmethod
    def decompress(cls, gathered: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Sum over ranks of scale_r * sign_r: gathered (R, payload) uint8 -> (numel,) fp32."""
        numel, nseg = sum(sizes), len(sizes)
        sizes_t, weights = _device_constants(tuple(sizes), gathered.device)
        out = torch.zeros(numel, dtype=torch.float32, device=gathered.device)
        for row in gathered:
            scales = row[-4 * nseg:].clone().view(torch.float32)  # (S,); clone: view needs alignment
            bits = (row[:-4 * nseg].unsqueeze(1) & weights).ne(0).reshape(-1)[:numel]  # (numel,) bool
            signs = bits.to(torch.float32).mul_(2.0).sub_(1.0)
            out.add_(signs.mul_(torch.repeat_interleave(scales, sizes_t, output_size=numel)))
        return out


def cast_payload(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy of ``tensor`` in ``dtype`` (fp16/bf16) for a dense all-reduce at half the bytes."""
    return tensor.to(dtype)
