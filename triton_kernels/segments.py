"""Top-k of every parameter of a bucket at once: per-segment selection.

A DDP bucket is a flat fp32 tensor holding several parameters (*segments*). Selecting per
segment (not over the whole bucket) keeps the results independent of the bucket layout, which
DDP changes after step 1 and again after a resume. Each segment ``s`` sends exactly ``ks[s]``
entries of largest ``|acc|`` (NaN above +inf above every finite value, ties to the lower index:
the rule of :mod:`.threshold`), into ``caps[s]`` slots padded with value 0 at the segment's first
index, in ascending index order.

Three functions, one selection:

* :func:`topk_select_segments_torch`, the reference: :func:`.topk_select.topk_select_torch` (the
  one torch reference of Top-K selection) run segment by segment.
* :func:`topk_select_segments`, the Triton path: :func:`.topk_select.topk_select` per segment (no
  host sync; launches per segment: a fused segmented radix select is future work).
* :func:`topk_select_segments_sampled`, the dispatcher's torch backend (CPU, CUDA without
  Triton): the whole bucket at once, because a call per parameter costs more than the selection.
  Int32 magnitude keys, one jittered sample of every large segment's keys (one gather) for a
  threshold a little below its k-th largest one, a candidate mask over the bucket (one slice
  compare per segment: no per-entry threshold tensor), one ``nonzero``, then the exact top-k
  among the few candidates by one stable sort on (segment, key) and a mask back in candidate
  (index) order. A segment whose sample overshot (fewer than k candidates) gets its exact
  threshold and the mask is rebuilt once. It returns bitwise what the reference returns.

Example::

    >>> import torch
    >>> acc = torch.tensor([1.0, -5.0, 2.0, 0.5, 3.0, -3.0])
    >>> v, i = topk_select_segments_sampled(acc, [0, 3], [3, 3], [1, 2], [2, 2])
    >>> v.tolist(), i.tolist(), acc.tolist()
    ([-5.0, 0.0, 3.0, -3.0], [1, 0, 4, 5], [1.0, 0.0, 2.0, 0.5, 0.0, 0.0])
"""

from __future__ import annotations

import math

import torch

from ._common import check_flat
from .threshold import INT32_MAX
from .topk_select import topk_select, topk_select_torch

__all__ = ["check_segments", "topk_select_segments", "topk_select_segments_sampled", "topk_select_segments_torch"]

# Segments up to this size take every entry as a candidate; larger ones are sampled this often.
_SAMPLE = 8192
_SAMPLER = torch.Generator()
_WORKSPACE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reused (numel,) buffer: a fresh bucket-sized tensor per call costs its page faults again
    (on CPU that is as much as the selection itself). Hooks select one bucket at a time."""
    buf = _WORKSPACE.get((device, dtype))
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[(device, dtype)] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def check_segments(acc: torch.Tensor, offsets, sizes, ks, caps) -> None:
    """Refuse segments that overlap, leave the bucket, or ask for more entries than they hold."""
    check_flat("acc", acc, (torch.float32,))
    if not len(offsets) == len(sizes) == len(ks) == len(caps):
        raise ValueError("offsets, sizes, ks, caps: give one entry per segment (lengths differ)")
    end = 0
    for s, (off, n, k, cap) in enumerate(zip(offsets, sizes, ks, caps)):
        if off < end or off + n > acc.numel():
            raise ValueError(f"segment {s}: [{off}, {off + n}) overlaps the previous one or leaves the bucket "
                             f"of {acc.numel()}; give ascending, disjoint segments")
        if n == 0 and cap > 0:
            raise ValueError(f"segment {s}: an empty segment has no first index to pad at; give capacity 0")
        if not 0 <= k <= min(n, cap):
            raise ValueError(f"segment {s}: k={k} must lie in [0, min(size={n}, capacity={cap})]")
        end = off + n


def _thresholds(keys: torch.Tensor, offsets: list[int], sizes: list[int], ks: list[int]) -> torch.Tensor:
    """(S,) int32 keys at or below each segment's k-th largest key (usually: few candidates)."""
    dev = keys.device
    thr = torch.zeros(len(sizes), dtype=torch.int32, device=dev)  # small segments: every entry
    rows = [j for j, n in enumerate(sizes) if n > _SAMPLE]
    if not rows:
        return thr
    n_b = torch.tensor([sizes[j] for j in rows], dtype=torch.int64, device=dev)
    k_b = torch.tensor([ks[j] for j in rows], dtype=torch.float64, device=dev)
    off_b = torch.tensor([offsets[j] for j in rows], dtype=torch.int64, device=dev)
    # NOTE: fixed-seed, so reruns select alike; jittered rather than strided picks, because a stride
    # that divides the kernel size samples one kernel position only (many exact zeros in ResNets)
    _SAMPLER.manual_seed(sum(sizes) * 31 + len(sizes))
    # one pick at a random place in each of _SAMPLE equal strata: ascending addresses (the gather
    # streams through memory instead of missing the cache on every pick)
    u = torch.rand((len(rows), _SAMPLE), generator=_SAMPLER, dtype=torch.float64).to(dev)
    u.add_(torch.arange(_SAMPLE, dtype=torch.float64, device=dev)).div_(_SAMPLE)
    picks = (u * n_b[:, None]).long().clamp_(max=n_b[:, None] - 1) + off_b[:, None]
    sample = keys[picks]  # (B, _SAMPLE)
    # a 2x margin over the expected number of sampled entries above the k-th largest key
    want = torch.clamp(torch.ceil(2.0 * k_b * _SAMPLE / n_b).long(), 2, _SAMPLE)  # (B,)
    most = min(_SAMPLE, max(2, math.ceil(2.0 * max(ks[j] * _SAMPLE / sizes[j] for j in rows))))
    top = torch.topk(sample, most, dim=1).values  # (B, most), descending
    thr[torch.tensor(rows, device=dev)] = top.gather(1, (want - 1)[:, None]).squeeze(1)
    return thr


def _candidates(keys: torch.Tensor, thr: list[int], starts: list[int], sizes: list[int]) -> torch.Tensor:
    """(c,) ascending positions whose key reaches their segment's threshold (gaps excluded)."""
    mask = _scratch(keys.numel(), torch.bool, keys.device)
    # NOTE: one compare per segment on a slice, not a per-entry threshold tensor: expanding the
    # thresholds (repeat_interleave) costs more on CPU than the whole selection
    end = 0
    for t, o, n in zip(thr, starts, sizes):
        mask[end:o].zero_()  # a gap: a dense or skipped parameter
        torch.ge(keys[o:o + n], t, out=mask[o:o + n])
        end = o + n
    return mask.nonzero().squeeze(1)


def topk_select_segments_sampled(acc: torch.Tensor, offsets, sizes, ks, caps) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (sum caps,) fp32, indices (sum caps,) int32 bucket-relative); sent entries of ``acc``
    are set to 0 in place. Bitwise the outputs of :func:`topk_select_segments_torch`, in one pass."""
    check_segments(acc, offsets, sizes, ks, caps)
    dev = acc.device
    total_cap = int(sum(caps))
    cap_t = torch.tensor(caps, dtype=torch.int64, device=dev)
    # padding: value 0 at the segment's first index (harmless to scatter-add)
    values = torch.zeros(total_cap, dtype=torch.float32, device=dev)
    indices = torch.repeat_interleave(torch.tensor(offsets, dtype=torch.int32, device=dev), cap_t,
                                      output_size=total_cap)
    live = [s for s, k in enumerate(ks) if k > 0]
    if not live:
        return values, indices
    lo, hi = offsets[live[0]], offsets[live[-1]] + sizes[live[-1]]
    span = acc[lo:hi]  # the live segments and the gaps between them (dense or skipped parameters)
    keys = torch.bitwise_and(span.view(torch.int32), INT32_MAX,  # (m,) orders like |acc|: NaN > inf > finite
                             out=_scratch(span.numel(), torch.int32, dev))
    starts = [offsets[s] - lo for s in live]
    seg_n, seg_k = [sizes[s] for s in live], [ks[s] for s in live]
    starts_t = torch.tensor(starts, dtype=torch.int64, device=dev)
    seg_k_t = torch.tensor(seg_k, dtype=torch.int64, device=dev)
    thr = _thresholds(keys, starts, seg_n, seg_k).tolist()
    for _attempt in range(2):
        cand = _candidates(keys, thr, starts, seg_n)
        cand_seg = torch.searchsorted(starts_t, cand, right=True) - 1  # (c,) segment of each
        counts = torch.bincount(cand_seg, minlength=len(live))
        short = (counts < seg_k_t).nonzero().squeeze(1).tolist()
        if not short:
            break
        for j in short:  # the sample overshot: this segment's exact k-th largest key
            o = starts[j]
            thr[j] = int(torch.topk(keys[o:o + seg_n[j]], seg_k[j], sorted=False).values.min())
    # exact top-k among candidates: order by segment, then key descending; stable, so equal keys
    # keep ascending index order (ties go to the lower index)
    order = torch.sort(cand_seg * (1 << 32) + (INT32_MAX - keys[cand].long()), stable=True).indices
    first = torch.cumsum(counts, 0) - counts  # each segment's first position among the candidates
    seg_sorted = cand_seg[order]
    keep = torch.arange(order.numel(), device=dev) - first[seg_sorted] < seg_k_t[seg_sorted]
    # back in candidate order, which is ascending (grouped by segment, index order inside): a mask
    # instead of sorting the chosen positions again
    picked = torch.zeros(cand.numel(), dtype=torch.bool, device=dev)
    picked[order[keep]] = True
    chosen, chosen_seg = cand[picked], cand_seg[picked]
    live_t = torch.tensor(live, dtype=torch.int64, device=dev)
    slot_base = (torch.cumsum(cap_t, 0) - cap_t)[live_t]  # each live segment's first payload slot
    kept_first = torch.cumsum(seg_k_t, 0) - seg_k_t
    slots = slot_base[chosen_seg] + torch.arange(chosen.numel(), device=dev) - kept_first[chosen_seg]
    values[slots] = span[chosen]
    indices[slots] = (chosen + lo).to(torch.int32)
    span[chosen] = 0.0
    return values, indices


def _per_segment(select, acc: torch.Tensor, offsets, sizes, ks, caps) -> tuple[torch.Tensor, torch.Tensor]:
    """``select(segment, k, capacity)`` (a (values, indices, count, residual) op) on each segment."""
    check_segments(acc, offsets, sizes, ks, caps)
    values = torch.zeros(int(sum(caps)), dtype=torch.float32, device=acc.device)
    indices = torch.empty(int(sum(caps)), dtype=torch.int32, device=acc.device)
    slot = 0
    for off, n, k, cap in zip(offsets, sizes, ks, caps):
        seg = acc[off:off + n]
        if k > 0:
            v, i, _count, residual = select(seg, k, cap)
            values[slot:slot + cap] = v
            indices[slot:slot + cap] = i.add_(off)  # unused slots hold 0 -> the segment's first index
            seg.copy_(residual)
        else:
            indices[slot:slot + cap] = off
        slot += cap
    return values, indices


def topk_select_segments_torch(acc: torch.Tensor, offsets, sizes, ks, caps) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: :func:`.topk_select.topk_select_torch` segment by segment; same outputs as above."""
    return _per_segment(topk_select_torch, acc, offsets, sizes, ks, caps)


def topk_select_segments(acc: torch.Tensor, offsets, sizes, ks, caps) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path: the same outputs as :func:`topk_select_segments_torch`, one select per segment."""
    return _per_segment(topk_select, acc, offsets, sizes, ks, caps)
