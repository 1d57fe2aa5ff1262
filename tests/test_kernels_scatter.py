"""Decompress (weighted scatter-add): Triton kernel (CPU interpreter) vs torch reference vs a loop oracle.

Run: ``TRITON_INTERPRET=1 .venv/bin/python -m pytest -q tests/test_kernels_scatter.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before the kernels are imported (decorated)

import pytest
import torch
from hetero_strategy.triton_kernels import scatter_add as sa

BLOCK = 64


def _payload(n, rows, width, count, dtype, seed):
    """(rows, width) payloads like compaction writes: `count` unique indices per row, then 0/0 padding."""
    g = torch.Generator().manual_seed(seed)
    values = torch.zeros(rows, width)
    indices = torch.zeros(rows, width, dtype=torch.int32)
    for r in range(rows):
        idx = torch.randperm(n, generator=g)[:count].sort().values
        indices[r, :count] = idx.to(torch.int32)
        values[r, :count] = torch.randn(count, generator=g)
    return values.to(dtype), indices


def _oracle(out, values, indices, weights):
    dense = out.double().clone()
    for r in range(values.shape[0]):
        w = 1.0 if weights is None else float(weights[r])
        for v, i in zip(values[r].double().tolist(), indices[r].tolist()):
            dense[i] += w * v
    return dense


@pytest.mark.parametrize("n, rows, width, count", [(1, 1, 1, 1), (7, 3, 7, 5), (BLOCK + 1, 2, BLOCK + 1, 60),
                                                   (3001, 4, BLOCK - 1, 40), (3001, 2, 300, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_reference_and_oracle(n, rows, width, count, dtype, weighted):
    values, indices = _payload(n, rows, width, min(count, n), dtype, seed=n + rows)
    weights = torch.rand(rows, generator=torch.Generator().manual_seed(9)) if weighted else None
    base = torch.randn(n, generator=torch.Generator().manual_seed(8))
    got = sa.scatter_add(base.clone(), values, indices, weights, block=BLOCK)
    ref = sa.scatter_add_torch(base.clone(), values, indices, weights)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)  # rows in order: deterministic, bitwise equal
    torch.testing.assert_close(got.double(), _oracle(base, values, indices, weights), rtol=1e-6, atol=1e-6)


def test_padding_is_harmless_and_rows_sum_at_shared_indices():
    out = torch.full((4,), 10.0)
    values = torch.tensor([[1.0, 2.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    indices = torch.tensor([[0, 3, 0, 0], [3, 0, 0, 0]], dtype=torch.int64)
    weights = torch.tensor([0.5, 0.25])
    got = sa.scatter_add(out.clone(), values, indices, weights, block=2)
    assert got.tolist() == [10.5, 10.0, 10.0, 12.0]
    assert sa.scatter_add_torch(out.clone(), values, indices, weights).tolist() == got.tolist()


def test_nan_and_inf_values_reach_the_bucket():
    values = torch.tensor([[float("nan"), float("inf"), 1.0]])
    indices = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    got = sa.scatter_add(torch.zeros(3), values, indices, torch.tensor([0.5]), block=BLOCK)
    torch.testing.assert_close(got, torch.tensor([float("inf"), 0.5, float("nan")]), equal_nan=True)


def test_empty_payload_leaves_out_unchanged():
    out = torch.arange(5.0)
    assert torch.equal(sa.scatter_add(out.clone(), torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.int32)), out)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sa.scatter_add(torch.zeros(4), torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32)),
         "indices: shape"),
        (lambda: sa.scatter_add(torch.zeros(4), torch.zeros(3), torch.zeros(3, dtype=torch.int32)), "values: expected 2-D"),
        (lambda: sa.scatter_add(torch.zeros(4), torch.zeros(2, 3), torch.zeros(2, 3)), "indices: dtype"),
        (lambda: sa.scatter_add(torch.zeros(4), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int32),
                                torch.ones(3)), "weights: 3 entries"),
        (lambda: sa.scatter_add(torch.zeros(4, dtype=torch.float16), torch.zeros(1, 1),
                                torch.zeros(1, 1, dtype=torch.int32)), "out: dtype"),
    ],
)
def test_bad_input_is_refused_with_field_and_fix(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
