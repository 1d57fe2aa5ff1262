"""Bytes a rank sends per step under each codec, from the model's parameter shapes and the world size.

Part of the cost model (with :mod:`.cost`, the seconds): the hooks, ``compression="auto"``, the
planner and ``bench compression-scaling`` all count bytes here.

The collectives move, per rank (what gloo's and NCCL's ring algorithms send):

* an all-reduce of B bytes: 2·(W−1)/W · B;
* an all-gather of P bytes from every rank: (W−1) · P;
* a broadcast of B bytes, averaged over the ranks (the root sends it, in turn): (W−1)/W · B.

Per codec, in the steady state (after warm-up, between dense syncs), with k = ⌈density·n⌉ per
parameter and the hooks' own sparse-or-dense rule (:func:`wire_entries`):

* ``dense`` — all-reduce of 4n; ``fp16`` / ``bf16`` — all-reduce of 2n;
* ``topk`` — all-gather of 8k (fp32 value + int32 index) per sparse parameter, all-reduce of the
  dense ones;
* ``topk_allreduce`` — all-reduce of 4k per sparse parameter (4n per dense one), broadcast of 4k;
* ``powersgd`` — torch's rule per tensor (``_should_compress``): all-reduces of P (rows·r) and
  Q (cols·r) for the compressed matrices, of the whole tensor for the rest.

What the transport adds (TCP/IP headers, acknowledgements, the collective's own messages) is two
numbers: ``framing``, per payload byte, and ``per_message``, per message a rank sends (a ring
all-reduce sends 2(W-1) of them, an all-gather W-1). ``bench compression-scaling`` fits both on
the smallest world it measures and checks the model on every other point.

Example::

    buckets = [[tuple(p.shape) for p in model.parameters()]]     # one bucket
    bytes_per_rank("topk_allreduce", buckets, world=64, density=0.01)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

__all__ = ["CODECS", "TCP_FRAMING", "bytes_per_rank", "collectives", "framing_of", "ring_traffic", "topk_k",
           "wire_entries"]

#: Header bytes of one full TCP frame on Ethernet: 20 IP + 20 TCP + 12 timestamp option inside the
#: MTU, 14 Ethernet outside it. NOTE: a veth's counter sees a GSO super-packet as one frame, so an
#: unshaped emulated link counts ~no headers; `tc tbf` splits them into real frames (bench plan at 100 Mbit/s).
TCP_FRAMING = (52, 14)


CODECS = ("dense", "fp16", "bf16", "topk", "topk_allreduce", "powersgd")


def topk_k(numel: int, density: float) -> int:
    """ceil(density x numel), at least 1 for a non-empty tensor; 0 for density 0 (a skipped step).

    Non-decreasing in density, so the largest k over ranks is the k of the largest density.
    """
    if numel == 0 or density <= 0.0:
        return 0
    return min(numel, max(1, math.ceil(density * numel)))


def wire_entries(capacity: int, world: int, shared: bool = False) -> float:
    """A sparse exchange's size in dense-all-reduce entries (the same time at the same bandwidth).

    An all-gather of ``capacity`` values + indices per rank moves as much per link as an
    all-reduce of ``capacity * world`` entries; with shared indices, the all-reduce of ``capacity``
    values plus the broadcast of ``capacity`` indices (half an all-reduce's traffic) is
    ``1.5 * capacity``, whatever the world size.
    """
    return 1.5 * capacity if shared else float(capacity * world)


def ring_traffic(kind: str, world: int) -> tuple[float, float]:
    """(bytes sent per payload byte, messages sent) by one rank in one collective of ``kind``:
    ``all_reduce`` (ring: 2(W-1)/W, 2(W-1)), ``all_gather`` (payload per rank: W-1, W-1) or
    ``broadcast`` (averaged over the ranks, the root in turn: (W-1)/W, (W-1)/W)."""
    if world < 2:
        return 0.0, 0.0
    return {"all_reduce": (2 * (world - 1) / world, 2 * (world - 1)),
            "all_gather": (world - 1, world - 1),
            "broadcast": ((world - 1) / world, (world - 1) / world)}[kind]


def collectives(codec: str, shapes: Sequence[Sequence[int]], world: int, density: float = 0.01,
                powersgd_rank: int = 4) -> list[tuple[str, float]]:
    """The (kind, payload bytes) of each collective one step issues for one bucket holding
    ``shapes``: kind is ``all_reduce``, ``all_gather`` (payload: per rank) or ``broadcast``."""
    if codec not in CODECS:
        raise ValueError(f"codec={codec!r} is invalid: choose one of {', '.join(CODECS)}")
    sizes = [math.prod(s) for s in shapes]
    if codec == "dense":
        return [("all_reduce", 4.0 * sum(sizes))]
    if codec in ("fp16", "bf16"):
        return [("all_reduce", 2.0 * sum(sizes))]
    if codec == "powersgd":  # torch's hook: the uncompressed tensors, then P, then Q
        parts = [_powersgd_parts(s, powersgd_rank) for s in shapes]
        return [("all_reduce", 4.0 * sum(p[i] for p in parts)) for i in range(3) if any(p[i] for p in parts)]
    shared = codec == "topk_allreduce"
    sparse_k, dense_n = [], []
    for n in sizes:
        k = topk_k(n, density)
        if wire_entries(k, world, shared) >= n:  # the hooks send this parameter dense
            dense_n.append(n)
        else:
            sparse_k.append(k)
    out = []
    if shared:  # values and dense parts in one all-reduce (+ the marker), the next indices broadcast
        out.append(("all_reduce", 4.0 * (sum(sparse_k) + sum(dense_n) + 1)))
        if sparse_k:
            out.append(("broadcast", 4.0 * sum(sparse_k)))
        return out
    if sparse_k:  # fp32 value + int32 index per entry, the marker riding along
        out.append(("all_gather", 8.0 * sum(sparse_k) + 4))
    if dense_n or not sparse_k:
        out.append(("all_reduce", 4.0 * sum(dense_n) + (0 if sparse_k else 4)))
    return out


def framing_of(tier: str, mtu: int = 1500) -> float:
    """Wire bytes per payload byte on a link of ``tier``: TCP/IP over Ethernet on the eth tiers, the
    payload alone on NVLink and InfiniBand (their headers are a few bytes per 4 KB: left out)."""
    if not tier.startswith("eth"):
        return 1.0
    inside, outside = TCP_FRAMING
    return (mtu + outside) / (mtu - inside)


def bytes_per_rank(codec: str, buckets: Sequence[Sequence[Sequence[int]]], world: int, density: float = 0.01,
                   powersgd_rank: int = 4, framing: float = 1.0, per_message: float = 0.0) -> float:
    """Bytes one rank sends per step (the mean over ranks), for ``world`` ranks and DDP's
    ``buckets`` (each a list of parameter shapes, as DDP laid them out).

    ``framing`` scales payload bytes (headers proportional to the data); ``per_message`` adds a
    fixed cost per message a rank sends (a ring step, one peer of an all-gather, a broadcast's
    share): what the transport spends on each message whatever its size.
    """
    if world < 2:
        return 0.0
    total = 0.0
    for shapes in buckets:
        for kind, payload in collectives(codec, shapes, world, density, powersgd_rank):
            factor, messages = ring_traffic(kind, world)
            total += framing * factor * payload + per_message * messages
    return total


def _powersgd_parts(shape: Sequence[int], rank: int) -> tuple[int, int, int]:
    """fp32 entries torch's PowerSGD hook all-reduces for one tensor: (uncompressed, P, Q)."""
    n = math.prod(shape)
    rows = shape[0] if len(shape) else 1
    cols = n // max(rows, 1)  # as the hook does: tensor.view(shape[0], -1)
    r = min(rank, rows, cols)  # torch caps the rank at the matrix's smaller side
    if _should_compress(rows, cols, r, 2)[0]:  # min_compression_rate=2, PowerSGDState's default
        return 0, rows * r, cols * r
    return n, 0, 0
