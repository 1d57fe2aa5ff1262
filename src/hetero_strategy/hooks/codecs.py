"""Compressors (GRACE's "Compressor" role): turn a flat fp32 gradient into a payload and back.

* :class:`TopKCodec` — the k largest-magnitude entries as fp32 values + int32 indices, packed into
  one fp32 buffer of fixed capacity (indices bit-cast), so one all-gather moves both.
* :class:`SignCodec` — 1 bit per entry (packed 8 per byte) plus one fp32 scale (mean |x|).
* :func:`cast_payload` — fp16/bf16 cast for a dense all-reduce.

Selection, error feedback and scatter-add go through ``hetero_strategy.triton_kernels.dispatch``
only (Triton on GPU, its torch path elsewhere): one implementation of each, one tie rule.

Example::

    acc = torch.randn(1000)
    payload, residual = TopKCodec.compress(acc, k=10, capacity=16)  # (32,) fp32, (1000,) fp32
    dense = TopKCodec.decompress(payload.view(1, -1), numel=1000)   # (1000,), 10 non-zeros
    assert torch.equal(dense + residual, acc)
"""

from __future__ import annotations

from functools import lru_cache

import torch

from hetero_strategy.triton_kernels import dispatch

__all__ = ["SignCodec", "TopKCodec", "cast_payload", "ef_accumulate", "ef_accumulate_"]


def ef_accumulate(grad: torch.Tensor, residual: torch.Tensor | None, gamma: float,
                  backend: str = "auto") -> torch.Tensor:
    """acc = grad + gamma * residual in fp32 (a new tensor; ``grad`` is not modified)."""
    return dispatch.ef_accumulate(grad, residual, gamma, backend=backend)


def ef_accumulate_(buf: torch.Tensor, residual: torch.Tensor, gamma: float, backend: str = "auto") -> torch.Tensor:
    """acc = buf + gamma * residual, written into ``buf`` when it is fp32 (no new (n,) tensor)."""
    return dispatch.ef_accumulate(buf, residual, gamma, backend=backend, inplace=True)


class TopKCodec:
    """Top-K sparsification with a fixed-capacity payload (padding: value 0 at index 0)."""

    @staticmethod
    def payload_numel(capacity: int) -> int:
        return 2 * capacity  # fp32 values then int32 indices bit-cast to fp32

    @staticmethod
    def select_(acc: torch.Tensor, k: int, capacity: int, backend: str = "auto"):
        """(values (capacity,) fp32, indices (capacity,) int32); zeroes the k sent entries of acc in place."""
        return TopKCodec.select_segments_(acc, [0], [acc.numel()], [k], [capacity], backend)

    @staticmethod
    def select_segments_(acc: torch.Tensor, offsets: list[int], sizes: list[int], ks: list[int],
                         caps: list[int], backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
        """Per segment (parameter) of a bucket: its ks[s] largest entries in caps[s] slots, in one
        pass over the bucket; values (sum caps,) fp32, bucket-relative indices (sum caps,) int32."""
        return dispatch.topk_select_segments(acc, offsets, sizes, ks, caps, backend=backend)

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
        indices = gathered[:, capacity:].contiguous().view(torch.int32)  # (R, capacity)
        return dispatch.scatter_add(out, gathered[:, :capacity].contiguous(), indices, backend=backend)


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
