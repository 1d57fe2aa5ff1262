"""Threshold for a target k without a sort: a radix select over the bits of |acc|.

For finite and non-finite floats alike, the int32 bit pattern of ``|x|`` (``bits & 0x7FFFFFFF``)
orders like ``|x|``, with +inf above every finite value and every NaN above +inf. That *key*
is resolved most-significant digit first: pass 1 histograms bits 30..20 (2048 bins), pass 2
bits 19..10 and pass 3 bits 9..0 (1024 bins each), each pass counting only the elements whose
higher digits equal the prefix chosen so far. A one-program scan kernel after each pass picks
the digit that holds the k-th largest key, entirely on the device (no host read, no sort).

The result is a (2,) int32 device tensor ``state = [threshold_key, take_equal]``:

* select every element with ``key > threshold_key``;
* plus the first ``take_equal`` elements (in index order) with ``key == threshold_key``.

That selects **exactly k** elements, ties broken by lower index. ``passes=3`` resolves all 31
key bits (the exact top-k by magnitude); ``passes=2`` (or 1) compares keys truncated to their
top 21 (11) bits, i.e. magnitudes within a relative 2^-13 (2^-3) of the k-th one count as ties
and are taken in index order, still exactly k selected. Keys are always
compared after ``>> low_shift(passes)``; ``threshold_key`` holds the kept bits in place.
Special cases: ``k <= 0`` gives ``[INT32_MAX, 0]`` (nothing selected), ``k >= n`` gives
``[-1, 0]`` (everything selected).

Example::

    >>> import torch
    >>> from hetero_strategy.triton_kernels.threshold import topk_threshold_torch
    >>> acc = torch.tensor([0.5, -3.0, 2.0, 2.0])
    >>> t, take = topk_threshold_torch(acc, 2).tolist()   # keys: |-3| > |2| == |2| > |0.5|
    >>> t == torch.tensor(2.0).view(torch.int32).item(), take
    (True, 1)
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_flat, check_launchable, launch, tl, triton

__all__ = ["INT32_MAX", "abs_key", "low_shift", "topk_threshold", "topk_threshold_torch", "topk_threshold_with_counts"]

INT32_MAX = 2**31 - 1
# (shift, width) of the key digit resolved by each pass, most significant first.
_DIGITS = ((20, 11), (10, 10), (0, 10))


def low_shift(passes: int) -> int:
    """Number of low key bits that ``passes`` radix passes leave unresolved (20, 10 or 0)."""
    if passes not in (1, 2, 3):
        raise ValueError(f"passes: {passes} not allowed; use 3 (exact), 2 or 1 (coarser ties)")
    return _DIGITS[passes - 1][0]


def abs_key(acc: torch.Tensor, passes: int = 3) -> torch.Tensor:
    """(n,) int32 sort key of ``|acc|`` (NaN > inf > finite), truncated as ``passes`` resolves it."""
    return (acc.view(torch.int32) & INT32_MAX) >> low_shift(passes)


if HAS_TRITON:

    @triton.jit
    def _radix_hist_kernel(
        # inputs: fp32 acc, or (SRC_IS_KEYS) int32 keys with their count at src_count_ptr
        src_ptr,
        src_count_ptr,
        state_ptr,
        # outputs
        hist_ptr,
        cand_ptr,
        cand_count_ptr,
        seg_ptr,
        counts_ptr,
        # constants
        n,
        num_blocks,
        SHIFT: tl.constexpr,
        WIDTH: tl.constexpr,
        NUM_BINS: tl.constexpr,
        FIRST: tl.constexpr,
        SRC_IS_KEYS: tl.constexpr,
        APPEND: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if SRC_IS_KEYS:
            # Candidates appended by the previous pass; programs past their count do nothing.
            valid = offs < tl.load(src_count_ptr)
            key = tl.load(src_ptr + offs, mask=valid, other=0)
        else:
            valid = offs < n
            x = tl.load(src_ptr + offs, mask=valid, other=0.0)
            key = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        digit = (key >> SHIFT) & (NUM_BINS - 1)
        match = valid
        if not FIRST:
            # Only elements whose higher digits equal the prefix picked by earlier passes count.
            prefix = tl.load(state_ptr)
            match = valid & ((key >> (SHIFT + WIDTH)) == (prefix >> (SHIFT + WIDTH)))
        # NOTE: the histogram is one shared-memory atomic per element, which serialises when a
        # warp's keys share a bin. Exact zeros (untouched embedding rows, dead units) are the common
        # such case, so they are counted with a reduction instead and added to bin 0.
        zero = match & (key == 0)
        h = tl.histogram(digit, NUM_BINS, mask=match & (key != 0))  # (NUM_BINS,) int32, block-local
        bins = tl.arange(0, NUM_BINS)
        h += tl.where(bins == 0, tl.sum(zero.to(tl.int32), axis=0), 0)
        # NOTE: flush only non-empty bins: gradients occupy few exponents, so this saves most atomics.
        # Relaxed order is enough: nothing reads the histogram before this kernel has finished.
        tl.atomic_add(hist_ptr + bins, h, mask=h > 0, sem="relaxed")
        if APPEND:
            # Keep the keys that matched: the last pass and the compaction counts then read only
            # these instead of all of acc. Each block appends one contiguous segment (start, length
            # kept in seg); the order of the segments (block arrival) does not matter.
            m = match.to(tl.int32)
            num = tl.sum(m, axis=0)
            start = tl.atomic_add(cand_count_ptr, num, sem="relaxed")
            tl.store(cand_ptr + start + tl.cumsum(m, axis=0) - m, key, mask=match)
            tl.store(seg_ptr + tl.program_id(0), start)
            tl.store(seg_ptr + num_blocks + tl.program_id(0), num)
            # Keys above the prefix are above the final threshold too: this block's share of
            # "#(key > T)" for the compaction, minus the candidates, which are counted later.
            above = valid & ((key >> (SHIFT + WIDTH)) > (prefix >> (SHIFT + WIDTH)))
            tl.store(counts_ptr + tl.program_id(0), tl.sum(above.to(tl.int32), axis=0))

    @triton.jit
    def _radix_scan_kernel(
        # inputs
        hist_ptr,
        # outputs (read too, after the first pass)
        state_ptr,
        # constants
        k,
        SHIFT: tl.constexpr,
        NUM_BINS: tl.constexpr,
        FIRST: tl.constexpr,
    ):
        bins = tl.arange(0, NUM_BINS)
        h = tl.load(hist_ptr + bins)  # (NUM_BINS,) int32 counts of matching elements per digit
        if FIRST:
            prefix = 0
            k_rem = k
        else:
            prefix = tl.load(state_ptr)
            k_rem = tl.load(state_ptr + 1)
        at_least = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # elements with digit >= bin
        # The k_rem-th largest matching key lies in the highest bin with >= k_rem at or above it.
        d = tl.max(tl.where(at_least >= k_rem, bins, -1), axis=0)
        above = tl.sum(tl.where(bins > d, h, 0), axis=0)
        tl.store(state_ptr, prefix | (d << SHIFT))
        tl.store(state_ptr + 1, k_rem - above)

    @triton.jit
    def _candidate_count_kernel(
        # inputs
        cand_ptr,
        seg_ptr,
        state_ptr,
        # outputs: (2, num_blocks) int32; row 0 holds the above-prefix counts of pass 2 already
        counts_ptr,
        # constants
        num_blocks,
        BLOCK: tl.constexpr,
    ):
        # One program per block of acc: its candidates (at most BLOCK) are one contiguous segment.
        pid = tl.program_id(0)
        start = tl.load(seg_ptr + pid)
        offs = tl.arange(0, BLOCK)
        valid = offs < tl.load(seg_ptr + num_blocks + pid)
        key = tl.load(cand_ptr + start + offs, mask=valid, other=0)
        t = tl.load(state_ptr)
        above = tl.load(counts_ptr + pid)
        tl.store(counts_ptr + pid, above + tl.sum((valid & (key > t)).to(tl.int32), axis=0))
        tl.store(counts_ptr + num_blocks + pid, tl.sum((valid & (key == t)).to(tl.int32), axis=0))

else:  # pragma: no cover - only without Triton
    _radix_hist_kernel = _radix_scan_kernel = _candidate_count_kernel = None


def _trivial_state(n: int, k: int, device: torch.device) -> torch.Tensor | None:
    """State for k <= 0 or k >= n, built with fills only (no host-to-device copy, no sync)."""
    if 0 < k < n:
        return None
    state = torch.full((2,), INT32_MAX if k <= 0 else -1, dtype=torch.int32, device=device)
    state[1:].zero_()
    return state


def topk_threshold_torch(acc: torch.Tensor, k: int, *, passes: int = 3) -> torch.Tensor:
    """Reference: (2,) int32 ``[threshold_key, take_equal]`` from ``torch.topk`` over the keys.

    Args:
        acc: (n,) fp32 accumulator.
        k: target count (clamped to [0, n]).
        passes: 3 = exact keys; 2/1 = keys truncated like the Triton path with that many passes.
    """
    check_flat("acc", acc, (torch.float32,))
    shift = low_shift(passes)
    n = acc.numel()
    trivial = _trivial_state(n, k, acc.device)
    if trivial is not None:
        return trivial
    keys = abs_key(acc, passes)  # (n,) int32
    kth = torch.topk(keys, k, sorted=False).values.min()  # k-th largest key; topk of ints is exact
    above = (keys > kth).sum()
    return torch.stack([kth << shift, k - above]).to(torch.int32)


def topk_threshold(acc: torch.Tensor, k: int, *, passes: int = 3, block: int = 4096) -> torch.Tensor:
    """Triton launcher; returns the same (2,) int32 device tensor as :func:`topk_threshold_torch`.

    Cost: ``min(passes, 2)`` reads of ``acc`` plus ``passes`` single-program scans, no host sync.
    With ``passes=3`` the second pass also appends the keys that share the 11-bit
    prefix (the *candidates*) to a buffer, and the third pass histograms only those: for
    spread-out gradients that is a few percent of ``n``; if every key shares the prefix (e.g.
    all zeros) it costs one extra write and two reads of ``4n`` bytes.
    ``block`` (power of two) is the number of elements per histogram program.
    """
    return topk_threshold_with_counts(acc, k, passes=passes, block=block)[0]


def topk_threshold_with_counts(acc: torch.Tensor, k: int, *, passes: int = 3, block: int = 4096):
    """:func:`topk_threshold` plus, when it comes almost free, the compaction's block counts.

    Returns ``(state, counts)``. With ``passes=3`` and ``0 < k < n``, ``counts`` is the (2,
    cdiv(n, block)) int32 tensor of ``#(key > T)`` and ``#(key == T)`` per block of ``block``
    elements, built from the above-prefix counts of pass 2 and the candidates only, which saves
    :func:`.compact` a full read of ``acc`` (pass it as ``counts=``); otherwise ``None``.
    """
    check_flat("acc", acc, (torch.float32,))
    low_shift(passes)  # validates passes
    if block <= 0 or block & (block - 1):
        raise ValueError(f"block: {block} is not a positive power of two; use e.g. 4096")
    check_launchable(_radix_hist_kernel, acc)
    n = acc.numel()
    trivial = _trivial_state(n, k, acc.device)
    if trivial is not None:
        return trivial, None
    dev = acc.device
    state = torch.empty(2, dtype=torch.int32, device=dev)  # written by the first scan
    num_blocks = triton.cdiv(n, block)
    # NOTE: one zero-fill for every zero-initialised buffer (a launch costs more than the bytes).
    zeros = torch.zeros(passes * 2048 + 1 + (2 * num_blocks if passes == 3 else 0), dtype=torch.int32, device=dev)
    hist = zeros[: passes * 2048].view(passes, 2048)  # one row per pass
    cand_count = zeros[passes * 2048 : passes * 2048 + 1]
    counts = zeros[passes * 2048 + 1 :].view(2, num_blocks) if passes == 3 else None
    # NOTE: sized for the worst case (every key shares the prefix); only candidates are written.
    # Without them a small live buffer stands in: Triton refuses null (empty-tensor) pointers on CUDA.
    cand = torch.empty(n, dtype=torch.int32, device=dev) if passes == 3 else zeros  # candidate keys
    seg = torch.empty(2, num_blocks, dtype=torch.int32, device=dev) if passes == 3 else zeros  # start, len
    for p, (shift, width) in enumerate(_DIGITS[:passes]):  # most significant digit first
        first = p == 0
        launch(
            _radix_hist_kernel,
            (num_blocks,),
            cand if p == 2 else acc, cand_count, state, hist[p], cand, cand_count, seg,
            counts if counts is not None else cand_count, n, num_blocks,
            SHIFT=shift, WIDTH=width, NUM_BINS=1 << width, FIRST=first,
            SRC_IS_KEYS=p == 2, APPEND=p == 1 and passes == 3, BLOCK=block,
        )
        launch(_radix_scan_kernel, (1,), hist[p], state, k, SHIFT=shift, NUM_BINS=1 << width, FIRST=first)
    if counts is not None:
        launch(_candidate_count_kernel, (num_blocks,), cand, seg, state, counts, num_blocks, BLOCK=block)
    return state, counts
