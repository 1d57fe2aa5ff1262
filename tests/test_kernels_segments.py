"""Per-segment Top-K of a whole bucket: the sampled one-pass path and the Triton path against the reference.

The reference is :func:`segments.topk_select_segments_torch`, the one Top-K reference
(:func:`topk_select_torch`, ``torch.topk`` over the magnitude keys) applied to each segment
alone; the sampled path (the dispatcher's torch backend) samples thresholds and sorts
candidates instead.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before the kernels are imported (decorated)

import pytest
import torch
from hetero_strategy.triton_kernels import dispatch, segments


def _reference(acc, offsets, sizes, ks, caps):
    """The kernel's reference on a copy: values, indices and the residual it leaves."""
    acc = acc.clone()
    values, indices = segments.topk_select_segments_torch(acc, offsets, sizes, ks, caps)
    return values, indices, acc


def _bucket(seed: int, large: bool):
    g = torch.Generator().manual_seed(seed)
    count = int(torch.randint(1, 9, (), generator=g))
    sizes = [int(torch.randint(1, 150_000 if large else 3_000, (), generator=g)) for _ in range(count)]
    offsets, pos = [], 0
    for n in sizes:  # gaps stand for parameters that went dense
        pos += int(torch.randint(0, 40, (), generator=g))
        offsets.append(pos)
        pos += n
    acc = torch.randn(pos + 5, generator=g)
    ks = [int(torch.randint(0, max(1, n // 8), (), generator=g)) for n in sizes]
    caps = [k + int(torch.randint(0, 3, (), generator=g)) for k in ks]
    return acc, offsets, sizes, ks, caps


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", ["plain", "ties", "nonfinite"])
def test_segmented_selection_equals_the_per_segment_reference(seed, kind):
    acc, offsets, sizes, ks, caps = _bucket(seed, large=seed % 2 == 1)
    if kind == "ties":  # many equal magnitudes of both signs around the k-th value, exact zeros
        acc = torch.round(acc * 2) / 2
        acc[::5] = 0.0
    if kind == "nonfinite":  # NaN ranks above +inf, above every finite value
        acc[offsets[0]] = float("nan")
        acc[offsets[-1] + sizes[-1] - 1] = float("-inf")
    want_v, want_i, want_acc = _reference(acc, offsets, sizes, ks, caps)
    got_acc = acc.clone()
    got_v, got_i = dispatch.topk_select_segments(got_acc, offsets, sizes, ks, caps, backend="torch")
    assert torch.equal(got_i, want_i)
    assert torch.equal(got_v.nan_to_num(9.0), want_v.nan_to_num(9.0))
    assert torch.equal(got_acc.nan_to_num(9.0), want_acc.nan_to_num(9.0))


def test_a_threshold_that_overshoots_falls_back_to_the_exact_one(monkeypatch):
    # jittered sampling with a 2x margin rarely overshoots; force it: every sampled threshold is
    # above the k-th key, so each segment must fall back to its exact k-th largest key
    monkeypatch.setattr(segments, "_thresholds", lambda keys, starts, sizes, ks: torch.full(
        (len(sizes),), 2**31 - 1, dtype=torch.int32))
    acc, offsets, sizes, ks, caps = _bucket(5, large=True)
    ks = [max(1, k) for k in ks]
    caps = [max(c, k) for c, k in zip(caps, ks)]
    want_v, want_i, want_acc = _reference(acc, offsets, sizes, ks, caps)
    got_acc = acc.clone()
    got_v, got_i = dispatch.topk_select_segments(got_acc, offsets, sizes, ks, caps, backend="torch")
    assert torch.equal(got_i, want_i) and torch.equal(got_v, want_v) and torch.equal(got_acc, want_acc)


def test_triton_segments_equal_torch_under_the_interpreter():
    acc, offsets, sizes, ks, caps = _bucket(3, large=False)
    a, b = acc.clone(), acc.clone()
    tv, ti = dispatch.topk_select_segments(a, offsets, sizes, ks, caps, backend="triton")
    rv, ri = dispatch.topk_select_segments(b, offsets, sizes, ks, caps, backend="torch")
    assert torch.equal(ti, ri) and torch.equal(tv, rv) and torch.equal(a, b)
    want_v, want_i, want_acc = _reference(acc, offsets, sizes, ks, caps)
    assert torch.equal(ti, want_i) and torch.equal(tv, want_v) and torch.equal(a, want_acc)


def test_reference_on_a_hand_built_bucket():
    # segment [0, 3): |1 -5 2| -> k = 1: -5 (index 1), one pad slot (value 0 at index 0);
    # gap at 3; segment [4, 8): |3 -3 0.5 3| -> k = 2: ties of 3 go to the lower indices 4, 5; k = 0
    # segment [8, 9): two pad slots at index 8
    acc = torch.tensor([1.0, -5.0, 2.0, 7.0, 3.0, -3.0, 0.5, 3.0, 9.0])
    values, indices = segments.topk_select_segments_torch(acc, [0, 4, 8], [3, 4, 1], [1, 2, 0], [2, 2, 2])
    assert values.tolist() == [-5.0, 0.0, 3.0, -3.0, 0.0, 0.0]
    assert indices.tolist() == [1, 0, 4, 5, 8, 8]
    assert acc.tolist() == [1.0, 0.0, 2.0, 7.0, 0.0, 0.0, 0.5, 3.0, 9.0]  # sent entries zeroed, gap untouched


@pytest.mark.parametrize("bad, match", [
    (([0, 5], [10, 10], [1, 1], [1, 1]), "segment 1: \\[5, 15\\) overlaps"),
    (([0], [10], [11], [11]), "segment 0: k=11"),
    (([0], [10], [3], [2]), "capacity=2"),
    (([0], [30], [1], [1]), "leaves the bucket of 20"),
])
def test_bad_segments_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        dispatch.topk_select_segments(torch.zeros(20), *bad, backend="torch")
