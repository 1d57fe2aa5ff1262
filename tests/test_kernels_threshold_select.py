"""Threshold selection (Ok-Topk's reused threshold): Triton (CPU interpreter) vs torch reference vs
oracles written from the rule in plain Python, and a hand-built case.

Run: ``TRITON_INTERPRET=1 .venv/bin/python -m pytest -q tests/test_kernels_threshold_select.py``.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before the kernels are imported (decorated)

import pytest
import torch
from hetero_strategy.triton_kernels import dispatch, segments
from hetero_strategy.triton_kernels import threshold_select as ts

BLOCK = 64  # small blocks: several programs per segment under the interpreter
INT32_MAX = 2**31 - 1
INF = float("inf")


def _key(x: float) -> int:
    return torch.tensor([x]).view(torch.int32).item() & INT32_MAX


def _oracle(acc: torch.Tensor, offsets, sizes, thresholds, caps):
    """Sent (index, value) pairs per segment from the rule: key > t; NaN/inf first; index order; cap."""
    keys = [b & INT32_MAX for b in acc.view(torch.int32).tolist()]
    out = []
    for off, n, t, cap in zip(offsets, sizes, thresholds, caps):
        picked = [i for i in range(off, off + n) if keys[i] > t]
        picked = [i for i in picked if keys[i] >= 0x7F800000] + [i for i in picked if keys[i] < 0x7F800000]
        out.append(picked[:cap])
    return out


def _bucket(seed: int):
    g = torch.Generator().manual_seed(seed)
    sizes = [int(torch.randint(1, 400, (), generator=g)) for _ in range(int(torch.randint(1, 6, (), generator=g)))]
    offsets, pos = [], 0
    for n in sizes:  # gaps stand for parameters that went dense
        pos += int(torch.randint(0, 9, (), generator=g))
        offsets.append(pos)
        pos += n
    acc = torch.randn(pos + 3, generator=g)
    ks = [int(torch.randint(0, max(1, n // 4), (), generator=g)) for n in sizes]
    return acc, offsets, sizes, ks


def _check_against_oracle(acc, offsets, sizes, thresholds, caps, got):
    values, indices, sent = got["values"], got["indices"], got["sent"]
    expect = _oracle(acc, offsets, sizes, thresholds.tolist(), caps)
    slot = 0
    for s, (off, cap, want) in enumerate(zip(offsets, caps, expect)):
        m = len(want)
        assert sent[s].item() == m
        assert indices[slot:slot + m].tolist() == want
        assert indices[slot + m:slot + cap].tolist() == [off] * (cap - m)  # padding at the first index
        assert (values[slot + m:slot + cap] == 0).all()
        torch.testing.assert_close(values[slot:slot + m], acc[want], rtol=0, atol=0, equal_nan=True)
        slot += cap
    sent_idx = [i for w in expect for i in w]
    keep = torch.ones_like(acc, dtype=torch.bool)
    keep[sent_idx] = False
    torch.testing.assert_close(got["acc"][keep], acc[keep], rtol=0, atol=0, equal_nan=True)
    assert (got["acc"][~keep] == 0).all()


def _run(backend, acc, offsets, sizes, thresholds, caps):
    a = acc.clone()
    if backend == "triton":
        v, i, s = ts.threshold_select_segments(a, offsets, sizes, thresholds, caps, block=BLOCK)
    else:
        v, i, s = ts.threshold_select_segments_torch(a, offsets, sizes, thresholds, caps)
    return {"values": v, "indices": i, "sent": s, "acc": a}


def test_a_hand_built_bucket_by_both_backends():
    nan = float("nan")
    acc = torch.tensor([0.5, -3.0, 2.0, 0.0, 9.0,  # segment 0: [0, 4)
                        7.0, 1.0, -8.0, 6.0, nan, -INF])  # segment 1: [5, 11) with a gap at 4
    thresholds = torch.tensor([_key(1.0), _key(5.0)], dtype=torch.int32)  # |x| > 1, |x| > 5
    for backend in ("torch", "triton"):
        got = _run(backend, acc, [0, 5], [4, 6], thresholds, [3, 4])
        # segment 0: -3, 2 (0.5 and 0 stay); segment 1: NaN, -inf first, then 7, -8; 6 overflows
        assert got["indices"].tolist() == [1, 2, 0, 9, 10, 5, 7], backend
        assert got["values"][[0, 1, 2, 5, 6]].tolist() == [-3.0, 2.0, 0.0, 7.0, -8.0], backend
        assert torch.isnan(got["values"][3]) and got["values"][4].item() == -INF, backend
        assert got["sent"].tolist() == [2, 4], backend
        assert got["acc"].tolist() == [0.5, 0.0, 0.0, 0.0, 9.0, 0.0, 1.0, 0.0, 6.0, 0.0, 0.0], backend


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["estimated", "overflow", "ties", "nonfinite"])
def test_triton_equals_the_reference_and_both_follow_the_rule(seed, kind):
    acc, offsets, sizes, ks = _bucket(seed)
    caps = [k + 2 for k in ks]
    if kind == "ties":  # many equal magnitudes of both signs, exact zeros
        acc = torch.round(acc * 2) / 2
        acc[::5] = 0.0
    if kind == "nonfinite":
        acc[offsets[0]] = float("nan")
        acc[offsets[-1] + sizes[-1] - 1] = -INF
    thresholds = ts.segment_thresholds_torch(acc, offsets, sizes, ks)
    if kind == "overflow":  # a stale threshold far below: more qualify than the slots hold
        caps = [max(1, k // 2) for k in ks]
        thresholds = torch.where(thresholds == INT32_MAX, thresholds, thresholds // 2)
    ref = _run("torch", acc, offsets, sizes, thresholds, caps)
    got = _run("triton", acc, offsets, sizes, thresholds, caps)
    for name in ("values", "indices", "sent", "acc"):
        a, b = got[name], ref[name]
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           b.view(torch.int32) if b.is_floating_point() else b), name
    _check_against_oracle(acc, offsets, sizes, thresholds, caps, ref)


@pytest.mark.parametrize("seed", range(4))
def test_estimates_are_the_kth_finite_magnitude_by_sort(seed):
    acc, offsets, sizes, ks = _bucket(seed)
    acc[offsets[0]] = float("nan")
    ks[-1] = sizes[-1] + 2  # k >= n: every non-zero entry
    want = []
    for off, n, k in zip(offsets, sizes, ks):
        finite = sorted((_key(x) for x in acc[off:off + n].tolist() if math.isfinite(x)), reverse=True)
        if k == 0:
            want.append(INT32_MAX)
        elif k >= n:
            want.append(0)
        else:
            want.append(max((finite + [0] * n)[k - 1] - 1, 0))
    assert ts.segment_thresholds_torch(acc, offsets, sizes, ks).tolist() == want
    assert ts.segment_thresholds(acc, offsets, sizes, ks).tolist() == want


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_fresh_estimate_selects_what_exact_top_k_selects(backend):
    # distinct finite magnitudes: no ties, so key > (k-th key - 1) is exactly the top k
    acc, offsets, sizes, ks = _bucket(11)
    caps = [k + 3 for k in ks]
    exact = acc.clone()
    ev, ei = segments.topk_select_segments_torch(exact, offsets, sizes, ks, caps)
    got = acc.clone()
    thresholds = dispatch.segment_thresholds(got, offsets, sizes, ks, backend=backend)
    v, i, sent = dispatch.threshold_select_segments(got, offsets, sizes, thresholds, caps, backend=backend)
    assert sent.tolist() == ks
    assert torch.equal(i, ei) and torch.equal(v, ev) and torch.equal(got, exact)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_zeros_nothing_and_empty_segments(backend):
    acc = torch.tensor([0.0, 0.0, 0.0, 5.0, -1.0, 2.0])
    # all-zero segment with k >= n sends nothing; k = 0 sends nothing; an empty segment has cap 0
    thresholds = dispatch.segment_thresholds(acc, [0, 3, 6], [3, 3, 0], [3, 0, 0], backend=backend)
    assert thresholds.tolist() == [0, INT32_MAX, INT32_MAX]
    got = acc.clone()
    v, i, sent = dispatch.threshold_select_segments(got, [0, 3, 6], [3, 3, 0], thresholds, [2, 2, 0],
                                                    backend=backend)
    assert sent.tolist() == [0, 0, 0] and i.tolist() == [0, 0, 3, 3] and torch.equal(got, acc)
    assert (v == 0).all()


def test_bad_arguments_are_refused():
    acc = torch.zeros(10)
    with pytest.raises(ValueError, match="thresholds: 1 on cpu"):
        ts.threshold_select_segments_torch(acc, [0, 5], [5, 5], torch.zeros(1, dtype=torch.int32), [1, 1])
    with pytest.raises(ValueError, match="segment 1: \\[3, 8\\) overlaps"):
        ts.threshold_select_segments_torch(acc, [0, 3], [5, 5], torch.zeros(2, dtype=torch.int32), [1, 1])
    with pytest.raises(ValueError, match="capacity 2 for size 0"):
        ts.threshold_select_segments_torch(acc, [0], [0], torch.zeros(1, dtype=torch.int32), [2])
    with pytest.raises(ValueError, match="block: 48"):
        ts.threshold_select_segments(acc, [0], [10], torch.zeros(1, dtype=torch.int32), [2], block=48)
