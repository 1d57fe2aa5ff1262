"""Top-k threshold + compaction: Triton kernels (CPU interpreter) vs torch reference vs a sort oracle.

Run: ``TRITON_INTERPRET=1 .venv/bin/python -m pytest -q tests/test_kernels_select.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before the kernels are imported (decorated)

import pytest
import torch
from hetero_strategy.triton_kernels import compact as cp
from hetero_strategy.triton_kernels import ef_accumulate as ef
from hetero_strategy.triton_kernels import scatter_add as sa
from hetero_strategy.triton_kernels import threshold as th
from hetero_strategy.triton_kernels import topk_select as ts

BLOCK = 64  # small blocks keep the interpreter fast and give several blocks per input
SIZES = [1, 7, BLOCK - 1, BLOCK + 1, 3001]
INT32_MAX = 2**31 - 1


def _oracle(acc: torch.Tensor, k: int, capacity: int, low: int = 0) -> list[int]:
    """Sent indices from first principles: rank by |x| bit pattern (NaN > inf), ties to lower index."""
    keys = [(b & INT32_MAX) >> low for b in acc.view(torch.int32).tolist()]
    chosen = sorted(range(len(keys)), key=lambda i: (-keys[i], i))[: min(k, len(keys))]
    return sorted(chosen)[:capacity]


def _assert_selection(acc, k, capacity, passes=3):
    ref = ts.topk_select_torch(acc, k, capacity, passes=passes)
    got = ts.topk_select(acc, k, capacity, passes=passes, block=BLOCK)
    expect = _oracle(acc, k, capacity, th.low_shift(passes))
    m = len(expect)
    for name, (values, indices, count, residual) in {"torch": ref, "triton": got}.items():
        assert count.dtype == torch.int32 and count.dim() == 0, name
        assert count.item() == m, name
        assert indices[:m].tolist() == expect, name
        assert torch.equal(indices[m:], torch.zeros_like(indices[m:])), name  # padding index 0
        assert torch.equal(values[m:], torch.zeros_like(values[m:])), name  # padding value 0
        torch.testing.assert_close(values[:m], acc[expect], rtol=0, atol=0, equal_nan=True)
        keep = torch.ones_like(acc, dtype=torch.bool)
        keep[expect] = False
        torch.testing.assert_close(residual[keep], acc[keep], rtol=0, atol=0, equal_nan=True)
        assert (residual[~keep] == 0).all(), name
    for a, b in zip(got, ref):  # the two backends agree bitwise
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           b.view(torch.int32) if b.is_floating_point() else b)
    return got


@pytest.mark.parametrize("n", SIZES)
def test_topk_matches_oracle_and_reference(n):
    g = torch.Generator().manual_seed(n)
    acc = torch.randn(n, generator=g)
    for k in sorted({0, 1, max(1, n // 10), n, n + 3}):
        _assert_selection(acc, k, capacity=max(k, 1))


@pytest.mark.parametrize("passes", [1, 2])
def test_truncated_keys_take_near_ties_in_index_order(passes):
    acc = torch.randn(700, generator=torch.Generator().manual_seed(3))
    for k in (1, 70, 699):
        _assert_selection(acc, k, capacity=k, passes=passes)


@pytest.mark.parametrize("n", [7, BLOCK + 1, 1000])
def test_threshold_state_equals_reference(n):
    acc = torch.randn(n, generator=torch.Generator().manual_seed(1)) * 1e3
    for k in (0, 1, n // 2, n - 1, n, n + 5):
        for passes in (1, 2, 3):
            got = th.topk_threshold(acc, k, passes=passes, block=BLOCK)
            assert torch.equal(got, th.topk_threshold_torch(acc, k, passes=passes)), (k, passes)


def test_ties_cross_blocks():
    # Magnitudes from {0.5, 1, 2}: most of the k-th value's ties spill over block boundaries.
    g = torch.Generator().manual_seed(5)
    acc = torch.tensor([0.5, -1.0, 1.0, 2.0, -2.0])[torch.randint(0, 5, (517,), generator=g)]
    for k in (1, 100, 200, 300, 516):
        _assert_selection(acc, k, capacity=k)


def test_all_zero_and_signed_zero():
    acc = torch.zeros(130)
    acc[::3] = -0.0
    _values, indices, count, _residual = _assert_selection(acc, 5, capacity=8)
    assert indices[:5].tolist() == [0, 1, 2, 3, 4] and count.item() == 5
    _assert_selection(torch.zeros(0), 3, capacity=2)  # empty bucket: nothing to send


def test_mostly_zero_bucket_threshold_above_and_among_zeros():
    # Like an embedding gradient: ~90% exact zeros (counted apart from the histogram atomics).
    g = torch.Generator().manual_seed(8)
    acc = torch.randn(1000, generator=g) * (torch.rand(1000, generator=g) < 0.1)
    nonzero = int(torch.count_nonzero(acc))
    for k in (1, nonzero - 1, nonzero, nonzero + 1, 600):
        _assert_selection(acc, k, capacity=k)


def test_nan_and_inf_are_always_sent():
    acc = torch.randn(200, generator=torch.Generator().manual_seed(2))
    acc[[150, 3, 77]] = float("nan")
    acc[[9, 120]] = torch.tensor([float("inf"), float("-inf")])
    acc[40] = -float("nan")
    _values, indices, _count, residual = _assert_selection(acc, 6, capacity=6)
    assert indices.tolist() == [3, 9, 40, 77, 120, 150]
    assert torch.isfinite(residual).all()  # nothing non-finite stays behind
    _assert_selection(acc, 2, capacity=2)  # fewer slots than NaNs: NaNs first, in index order


def test_capacity_overflow_keeps_first_in_index_order_rest_in_residual():
    acc = torch.randn(300, generator=torch.Generator().manual_seed(4))
    _values, _indices, count, residual = _assert_selection(acc, 120, capacity=50)
    assert count.item() == 50
    assert torch.count_nonzero(residual).item() == 300 - 50  # the 70 selected-but-unsent stay


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_error_feedback_conservation_through_fused_path(dtype):
    # docs/design.md semantics 6: sent_t + residual_t == grad_t + gamma * residual_{t-1}, exactly, over steps.
    g = torch.Generator().manual_seed(6)
    n, k, gamma = 517, 40, 0.9
    residual = None
    for _ in range(3):
        grad = torch.randn(n, generator=g).to(dtype)
        grad[11] = float("inf")
        acc = ef.ef_accumulate(grad, residual, gamma, block=BLOCK)
        torch.testing.assert_close(acc, ef.ef_accumulate_torch(grad, residual, gamma), rtol=0, atol=0)
        values, indices, count, residual = ts.topk_select(acc, k, capacity=k + 9, block=BLOCK)
        sent = sa.scatter_add(torch.zeros(n), values[None], indices[None], block=BLOCK)
        torch.testing.assert_close(sent + residual, acc, rtol=0, atol=0, equal_nan=True)
        assert count.item() == k and torch.isinf(sent[11])


@pytest.mark.parametrize("case", ["random", "ties", "zeros", "nonfinite"])
def test_block_counts_from_candidates_equal_a_direct_count(case):
    acc = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    if case == "ties":
        acc = acc.sign() * (acc.abs() > 1).float()
    elif case == "zeros":
        acc = torch.zeros(1000)
    elif case == "nonfinite":
        acc[::37] = float("nan")
        acc[5::91] = float("-inf")
    k = 100
    state, counts = th.topk_threshold_with_counts(acc, k, block=BLOCK)
    keys, t = th.abs_key(acc), th.topk_threshold_torch(acc, k)[0]
    assert state[0] == t
    pad = torch.full((-len(keys) % BLOCK,), -1, dtype=torch.int32)  # pads count in no block
    blocks = torch.cat([keys, pad]).view(-1, BLOCK)
    expect = torch.stack([(blocks > t).sum(1), (blocks == t).sum(1)]).to(torch.int32)
    assert torch.equal(counts, expect)


def test_compact_alone_matches_reference_for_handmade_state():
    acc = torch.tensor([3.0, -1.0, 1.0, 1.0, -1.0, 2.0, 1.0])
    state = torch.tensor([torch.tensor(1.0).view(torch.int32).item(), 2], dtype=torch.int32)
    got = cp.compact(acc, state, 4, block=2)
    ref = cp.compact_torch(acc, state, 4)
    assert got[1].tolist() == ref[1].tolist() == [0, 1, 2, 5]  # 3, 2 above; first two of the ties
    assert got[2].item() == ref[2].item() == 4


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ts.topk_select(torch.zeros(4, dtype=torch.float16), 1, 1, block=BLOCK), "acc: dtype"),
        (lambda: ts.topk_select(torch.zeros(4, 2), 1, 1, block=BLOCK), "acc: expected 1-D"),
        (lambda: ts.topk_select(torch.zeros(8)[::2], 1, 1, block=BLOCK), "contiguous"),
        (lambda: ts.topk_select(torch.zeros(4), -1, 1, block=BLOCK), "k: -1"),
        (lambda: ts.topk_select(torch.zeros(4), 1, -2, block=BLOCK), "capacity: -2"),
        (lambda: ts.topk_select(torch.zeros(4), 1, 1, block=48), "block: 48"),
        (lambda: ts.topk_select(torch.zeros(4), 1, 1, passes=4, block=BLOCK), "passes: 4"),
        (lambda: cp.compact(torch.zeros(4), torch.zeros(2, dtype=torch.int32), 1, block=BLOCK,
                            counts=torch.zeros(2, 3, dtype=torch.int32)), "counts: shape"),
        (lambda: cp.compact(torch.zeros(4), torch.zeros(3, dtype=torch.int32), 1, block=BLOCK), "state: 3"),
    ],
)
def test_bad_input_is_refused_with_field_and_fix(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
