"""Threshold selection: per segment, the entries whose ``|acc|`` exceeds a given threshold.

Ok-Topk's threshold reuse (Li and Hoefler, PPoPP 2022): the k-th largest magnitude of a
gradient moves slowly from step to step, so a threshold estimated once (:func:`segment_thresholds`,
the exact k-th key of :mod:`.threshold`) can be compared against for the next steps in a
streaming pass, with no select and no sort. The count then follows the gradient: it is measured
and returned, never assumed to be k.

Thresholds are int32 keys of :func:`.threshold.abs_key` (``|x|`` bits: NaN > +inf > finite), and a
segment takes the entries with ``key > threshold`` (strictly): the ``[threshold_key, take_equal=0]``
state of :mod:`.compact`. So ``threshold = INT32_MAX`` takes nothing, and an estimate is the k-th
largest finite key minus one, clamped to ``[0, FINITE_MAX_KEY]``: exact zeros never qualify (they
carry nothing), and NaN/inf always do.

Payload of segment ``s``: ``caps[s]`` slots, its non-finite entries first (index order), then its
finite ones above the threshold (index order), then padding (value 0 at the segment's first index:
harmless to scatter-add). When more qualify than ``caps[s]`` holds, the last finite ones in index
order are not sent and **stay in** ``acc`` (the residual): nothing is lost, and a NaN/inf is never
the one left behind while a slot holds a finite value (docs of :mod:`.dispatch`, NaN policy).
Sent entries are set to 0 in ``acc`` in place, so ``scatter(values) + acc_after == acc_before``.

Triton path: one launch counts per block (non-finite, finite above), one ``cumsum`` on the device,
one launch writes: two streaming reads of ``acc``, writes only where entries are sent, no host sync.

Example::

    >>> import torch
    >>> acc = torch.tensor([0.5, -3.0, 2.0, float("inf"), 0.25, 4.0])
    >>> thr = segment_thresholds_torch(acc, [0, 3], [3, 3], [1, 1])   # k-th finite key - 1
    >>> thr.tolist() == [abs_key(torch.tensor(3.0)).item() - 1, abs_key(torch.tensor(4.0)).item() - 1]
    True
    >>> v, i, sent = threshold_select_segments_torch(acc, [0, 3], [3, 3], thr, [2, 2])
    >>> v.tolist(), i.tolist(), sent.tolist(), acc.tolist()
    ([-3.0, 0.0, inf, 4.0], [1, 0, 3, 5], [1, 2], [0.5, 0.0, 2.0, 0.0, 0.25, 0.0])
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_flat, check_launchable, launch, tl, triton
from .threshold import INT32_MAX, abs_key, topk_threshold

__all__ = ["FINITE_MAX_KEY", "INF_KEY", "segment_thresholds", "segment_thresholds_torch",
           "threshold_select_segments", "threshold_select_segments_torch"]

INF_KEY = 0x7F800000  # key of +inf; every key at or above it is non-finite
FINITE_MAX_KEY = INF_KEY - 1  # key of the largest finite float: a threshold never exceeds it

if HAS_TRITON:

    @triton.jit
    def _masks(acc_ptr, seg_ptr, start_ptr, end_ptr, thr_ptr, pid, BLOCK: tl.constexpr):
        s = tl.load(seg_ptr + pid)  # this program's segment
        offs = tl.load(start_ptr + pid) + tl.arange(0, BLOCK)
        valid = offs < tl.load(end_ptr + pid)
        x = tl.load(acc_ptr + offs, mask=valid, other=0.0)
        key = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        take = valid & (key > tl.load(thr_ptr + s))
        bad = take & (key >= 0x7F800000)  # NaN/inf: their segment's first slots
        return s, offs, x, take & ~bad, bad

    @triton.jit
    def _count_kernel(
        # inputs
        acc_ptr, seg_ptr, start_ptr, end_ptr, thr_ptr,
        # outputs: (2, P) int32, row 0 = non-finite, row 1 = finite above the threshold
        counts_ptr,
        # constants
        num_progs,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        _, _, _, good, bad = _masks(acc_ptr, seg_ptr, start_ptr, end_ptr, thr_ptr, pid, BLOCK)
        tl.store(counts_ptr + pid, tl.sum(bad.to(tl.int32), axis=0))
        tl.store(counts_ptr + num_progs + pid, tl.sum(good.to(tl.int32), axis=0))

    @triton.jit
    def _write_kernel(
        # inputs (acc is also written: sent entries become 0)
        acc_ptr, seg_ptr, start_ptr, end_ptr, thr_ptr,
        base_ptr,  # (S,) int32 first payload slot of each segment
        cap_ptr,  # (S,) int32 payload slots of each segment
        before_ptr,  # (3, P) int32: non-finite and finite entries of earlier blocks of the segment,
        #              and the segment's non-finite total
        # outputs
        values_ptr, indices_ptr,
        # constants
        num_progs,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        s, offs, x, good, bad = _masks(acc_ptr, seg_ptr, start_ptr, end_ptr, thr_ptr, pid, BLOCK)
        bad_i, good_i = bad.to(tl.int32), good.to(tl.int32)
        pos_bad = tl.load(before_ptr + pid) + tl.cumsum(bad_i, axis=0) - bad_i
        pos_good = (tl.load(before_ptr + 2 * num_progs + pid) + tl.load(before_ptr + num_progs + pid)
                    + tl.cumsum(good_i, axis=0) - good_i)
        pos = tl.where(bad, pos_bad, pos_good)
        sent = (bad | good) & (pos < tl.load(cap_ptr + s))
        slot = tl.load(base_ptr + s) + pos
        tl.store(values_ptr + slot, x, mask=sent)
        tl.store(indices_ptr + slot, offs, mask=sent)
        tl.store(acc_ptr + offs, tl.zeros_like(x), mask=sent)  # exactly 0: never inf - inf

else:  # pragma: no cover - only without Triton
    _count_kernel = _write_kernel = None


def _check(acc: torch.Tensor, offsets, sizes, caps, thresholds: torch.Tensor | None = None) -> None:
    """Refuse segments that overlap, leave ``acc``, or pad at an index they do not have."""
    check_flat("acc", acc, (torch.float32,))
    if not len(offsets) == len(sizes) == len(caps):
        raise ValueError("offsets, sizes, caps: give one entry per segment (lengths differ)")
    if thresholds is not None:
        check_flat("thresholds", thresholds, (torch.int32,))
        if thresholds.numel() != len(sizes) or thresholds.device != acc.device:
            raise ValueError(f"thresholds: {thresholds.numel()} on {thresholds.device}; give one int32 key per "
                             f"segment ({len(sizes)}) on {acc.device} (segment_thresholds makes them)")
    end = 0
    for s, (off, n, cap) in enumerate(zip(offsets, sizes, caps)):
        if off < end or off + n > acc.numel():
            raise ValueError(f"segment {s}: [{off}, {off + n}) overlaps the previous one or leaves acc of "
                             f"{acc.numel()}; give ascending, disjoint segments")
        if cap < 0 or (n == 0 and cap > 0):
            raise ValueError(f"segment {s}: capacity {cap} for size {n}; give >= 0, and 0 for an empty segment")
        end = off + n


def _payload(acc: torch.Tensor, offsets, caps) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) (sum caps,) padded: value 0 at each segment's first index."""
    total = int(sum(caps))
    values = torch.zeros(total, dtype=torch.float32, device=acc.device)
    cap_t = torch.tensor(caps, dtype=torch.int64, device=acc.device)
    indices = torch.repeat_interleave(torch.tensor(offsets, dtype=torch.int32, device=acc.device), cap_t,
                                      output_size=total)
    return values, indices


def segment_thresholds_torch(acc: torch.Tensor, offsets, sizes, ks) -> torch.Tensor:
    """Reference: (S,) int32, each segment's k-th largest finite key minus 1 (``torch.topk``), clamped
    to [0, FINITE_MAX_KEY]; 0 (every non-zero entry) where k >= size, INT32_MAX (nothing) where k is 0."""
    _check(acc, offsets, sizes, [0] * len(sizes))
    out = []
    for off, n, k in zip(offsets, sizes, ks):
        if k <= 0 or n == 0:
            out.append(INT32_MAX)
        elif k >= n:
            out.append(0)
        else:
            keys = abs_key(acc[off:off + n])  # (n,) int32
            keys = torch.where(keys >= INF_KEY, 0, keys)  # NaN/inf qualify anyway: estimate on the finite ones
            kth = int(torch.topk(keys, k, sorted=False).values.min())
            out.append(min(max(kth - 1, 0), FINITE_MAX_KEY))
    return torch.tensor(out, dtype=torch.int32, device=acc.device)


def segment_thresholds(acc: torch.Tensor, offsets, sizes, ks) -> torch.Tensor:
    """Triton path of :func:`segment_thresholds_torch`, same values: the radix select of
    :func:`.threshold.topk_threshold` per segment, on a copy with NaN/inf zeroed; no host sync."""
    _check(acc, offsets, sizes, [0] * len(sizes))
    check_launchable(_count_kernel, acc)
    out = torch.full((len(sizes),), INT32_MAX, dtype=torch.int32, device=acc.device)
    for s, (off, n, k) in enumerate(zip(offsets, sizes, ks)):
        if k > 0 and n > 0:
            finite = torch.nan_to_num(acc[off:off + n], nan=0.0, posinf=0.0, neginf=0.0)
            # k >= n gives -1 (everything): clamped to 0, every non-zero entry, as the reference
            out[s:s + 1] = (topk_threshold(finite, k)[:1] - 1).clamp_(0, FINITE_MAX_KEY)
    return out


def threshold_select_segments_torch(acc: torch.Tensor, offsets, sizes, thresholds: torch.Tensor, caps):
    """Reference (``nonzero`` per segment): ``(values, indices, sent)`` as the module docstring says;
    ``sent`` is the (S,) int32 number of entries each segment sent; ``acc`` is changed in place."""
    _check(acc, offsets, sizes, caps, thresholds)
    values, indices = _payload(acc, offsets, caps)
    sent = torch.zeros(len(sizes), dtype=torch.int32, device=acc.device)
    slot = 0
    for s, (off, n, t, cap) in enumerate(zip(offsets, sizes, thresholds.tolist(), caps)):
        seg = acc[off:off + n]
        keys = abs_key(seg)  # (n,) int32
        idx = torch.nonzero(keys > t).flatten()  # ascending
        bad = keys[idx] >= INF_KEY  # a pass over the few qualifying entries only
        idx = torch.cat([idx[bad], idx[~bad]])[:cap]  # non-finite first, then index order
        m = idx.numel()
        values[slot:slot + m] = seg[idx]
        indices[slot:slot + m] = (idx + off).to(torch.int32)
        seg[idx] = 0.0
        sent[s] = m
        slot += cap
    return values, indices, sent


def threshold_select_segments(acc: torch.Tensor, offsets, sizes, thresholds: torch.Tensor, caps, *,
                              block: int = 4096):
    """Triton launcher: the outputs of :func:`threshold_select_segments_torch`, bitwise, no host sync.

    ``block`` (power of two): entries per program; a program never spans two segments.
    """
    _check(acc, offsets, sizes, caps, thresholds)
    if block <= 0 or block & (block - 1):
        raise ValueError(f"block: {block} is not a positive power of two; use e.g. 4096")
    check_launchable(_write_kernel, acc, thresholds)
    dev, nseg = acc.device, len(sizes)
    values, indices = _payload(acc, offsets, caps)
    # one program per block of each segment: (segment, start, end) per program, built on the host
    seg_of, starts, ends = [], [], []
    for s, (off, n) in enumerate(zip(offsets, sizes)):
        for lo in range(off, off + n, block):
            seg_of.append(s), starts.append(lo), ends.append(min(lo + block, off + n))
    num_progs = len(seg_of)
    if num_progs == 0:
        return values, indices, torch.zeros(nseg, dtype=torch.int32, device=dev)
    table = torch.tensor([seg_of, starts, ends], dtype=torch.int32, device=dev)  # (3, P), one copy
    seg_t, start_t, end_t = table[0], table[1], table[2]
    cap_t = torch.tensor(caps, dtype=torch.int32, device=dev)
    counts = torch.empty(2, num_progs, dtype=torch.int32, device=dev)
    launch(_count_kernel, (num_progs,), acc, seg_t, start_t, end_t, thresholds, counts, num_progs, BLOCK=block)
    seg64 = seg_t.long()
    totals = torch.zeros(2, nseg, dtype=torch.int32, device=dev).index_add_(1, seg64, counts)  # (2, S)
    # exclusive count of earlier blocks *of the same segment*: global prefix minus the segment's start
    excl = torch.cumsum(counts, dim=1, dtype=torch.int32) - counts  # (2, P)
    seg_first = torch.cumsum(totals, dim=1, dtype=torch.int32) - totals  # (2, S)
    before = torch.cat([excl - seg_first[:, seg64], totals[0, seg64][None]]).contiguous()  # (3, P)
    base = (torch.cumsum(cap_t, 0, dtype=torch.int32) - cap_t).contiguous()  # (S,)
    launch(_write_kernel, (num_progs,), acc, seg_t, start_t, end_t, thresholds, base, cap_t, before,
           values, indices, num_progs, BLOCK=block)
    return values, indices, torch.minimum(totals.sum(0, dtype=torch.int32), cap_t)
