"""Bytes a rank sends per step under each codec, from the model's parameter shapes and the world size.

The collectives move, per rank (what gloo's and NCCL's ring algorithms send):

* an all-reduce of B bytes: 2·(W−1)/W · B;
* an all-gather of P bytes from every rank: (W−1) · P;
* a broadcast of B bytes, averaged over the ranks (the root sends it, in turn): (W−1)/W · B.

Per codec, in the steady state (after warm-up, between dense syncs), with k = ⌈density·n⌉ per
parameter and the hooks' own sparse-or-dense rule (:func:`~hetero_strategy.hooks.cost.wire_entries`):

* ``dense`` — all-reduce of 4n; ``fp16`` / ``bf16`` — all-reduce of 2n;
* ``topk`` — all-gather of 8k (fp32 value + int32 index) per sparse parameter, all-reduce of the
  dense ones;
* ``topk_allreduce`` — all-reduce of 4k per sparse parameter (4n per dense one), broadcast of 4k;
* ``powersgd`` — torch's rule per tensor (``_should_compress``): all-reduces of P (rows·r) and
  Q (cols·r) for the compressed matrices, of the whole tensor for the rest.

Framing (TCP/IP headers, acknowledgements) is not in these figures: an interface counter sees a
few per cent more, the same factor for every codec (``bench compression-scaling`` fits it once).

Example::

    shapes = [tuple(p.shape) for p in model.parameters()]
    bytes_per_rank("topk_allreduce", shapes, world=64, density=0.01)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

from hetero_strategy.hooks.cost import wire_entries
from hetero_strategy.hooks.schedule import DensitySchedule

__all__ = ["CODECS", "bytes_per_rank"]

CODECS = ("dense", "fp16", "bf16", "topk", "topk_allreduce", "powersgd")


def bytes_per_rank(codec: str, shapes: Sequence[Sequence[int]], world: int, density: float = 0.01,
                   powersgd_rank: int = 4) -> float:
    """Payload bytes one rank sends per step (the mean over ranks), for ``world`` ranks."""
    if codec not in CODECS:
        raise ValueError(f"codec={codec!r} is invalid: choose one of {', '.join(CODECS)}")
    if world < 2:
        return 0.0
    ring, gather, bcast = 2 * (world - 1) / world, world - 1, (world - 1) / world
    sizes = [math.prod(s) for s in shapes]
    if codec == "dense":
        return ring * 4 * sum(sizes)
    if codec in ("fp16", "bf16"):
        return ring * 2 * sum(sizes)
    if codec == "powersgd":
        return ring * 4 * sum(_powersgd_entries(s, powersgd_rank) for s in shapes)
    shared = codec == "topk_allreduce"
    sent = 0.0
    for n in sizes:
        k = DensitySchedule.k_for(n, density)
        if wire_entries(k, world, shared) >= n:  # the hooks send this parameter dense
            sent += ring * 4 * n
        elif shared:
            sent += ring * 4 * k + bcast * 4 * k
        else:
            sent += gather * 8 * k
    return sent


def _powersgd_entries(shape: Sequence[int], rank: int) -> int:
    """fp32 entries torch's PowerSGD hook all-reduces for one tensor (P and Q, or the tensor)."""
    n = math.prod(shape)
    rows = shape[0] if len(shape) else 1
    cols = n // max(rows, 1)  # as the hook does: tensor.view(shape[0], -1)
    r = min(rank, rows, cols)  # torch caps the rank at the matrix's smaller side
    if _should_compress(rows, cols, r, 2)[0]:  # min_compression_rate=2, PowerSGDState's default
        return (rows + cols) * r
    return n
