"""Fused error-feedback accumulate: Triton kernel (CPU interpreter) vs torch reference vs float64 oracle.

Run: ``TRITON_INTERPRET=1 .venv/bin/python -m pytest -q tests/test_kernels_ef.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before the kernels are imported (decorated)

import pytest
import torch
from hetero_strategy.triton_kernels import ef_accumulate as ef

BLOCK = 64
SIZES = [1, 7, BLOCK - 1, BLOCK + 1, 3001]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference_and_float64_oracle(n, dtype):
    g = torch.Generator().manual_seed(n)
    grad = torch.randn(n, generator=g).to(dtype)
    residual = torch.randn(n, generator=g)
    for res, gamma in ((residual, 0.95), (None, 0.9), (residual, 0.0), (residual, 1.0)):
        got = ef.ef_accumulate(grad, res, gamma, block=BLOCK)
        assert got.dtype == torch.float32 and got.shape == (n,)
        # Bitwise equal to the reference: same association and no FMA contraction in the kernel.
        torch.testing.assert_close(got, ef.ef_accumulate_torch(grad, res, gamma), rtol=0, atol=0)
        scaled = 0.0 if res is None else gamma * res.double()
        oracle = grad.double() + scaled
        # Two fp32 roundings (the product, then the sum): error <= 2 ulp of the operands' magnitude.
        bound = 2 * 2.0**-24 * (grad.double().abs() + abs(scaled) if res is not None else grad.double().abs())
        assert ((got.double() - oracle).abs() <= bound).all()


def test_none_residual_is_zero_and_does_not_alias_grad():
    grad = torch.randn(10)
    acc = ef.ef_accumulate(grad, None, 0.5, block=BLOCK)
    assert torch.equal(acc, grad) and acc.data_ptr() != grad.data_ptr()
    ref = ef.ef_accumulate_torch(grad, None, 0.5)
    assert torch.equal(ref, grad) and ref.data_ptr() != grad.data_ptr()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, inf - inf
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_propagate_like_ieee(dtype):
    grad = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, 0.0]).to(dtype)
    residual = torch.tensor([1.0, 2.0, float("inf"), float("nan"), float("-inf")])
    got = ef.ef_accumulate(grad, residual, 0.9, block=BLOCK)
    expect = torch.tensor([float("nan"), float("inf"), float("nan"), float("nan"), float("-inf")])
    torch.testing.assert_close(got, expect, equal_nan=True)
    torch.testing.assert_close(got, ef.ef_accumulate_torch(grad, residual, 0.9), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("gamma", [0.9, 0.5, 1.0])
def test_in_place_form_writes_into_grad_within_one_rounding(gamma):
    g = torch.Generator().manual_seed(4)
    grad, residual = torch.randn(3001, generator=g), torch.randn(3001, generator=g)
    ref = ef.ef_accumulate_torch(grad, residual, gamma)
    buf = grad.clone()
    out = ef.ef_accumulate_torch_(buf, residual, gamma)
    assert out.data_ptr() == buf.data_ptr()  # no new bucket-sized tensor
    # a fused multiply-add (one rounding) vs the reference's two, and gamma as fp32: both within a
    # few ulp of the operands' magnitude of the float64 value; equal for powers of two
    exact = grad.double() + gamma * residual.double()
    scale = grad.double().abs() + gamma * residual.double().abs()
    assert ((out.double() - exact).abs() <= 2.0**-22 * scale).all()
    assert ((out.double() - ref.double()).abs() <= 2.0**-22 * scale).all()
    if gamma in (0.5, 1.0):
        assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="in-place form needs an fp32 grad"):
        ef.ef_accumulate_torch_(torch.zeros(3, dtype=torch.float16), torch.zeros(3), gamma)


def test_empty_bucket():
    assert ef.ef_accumulate(torch.zeros(0), torch.zeros(0), 0.9, block=BLOCK).shape == (0,)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ef.ef_accumulate(torch.zeros(4, dtype=torch.int32), None, 0.9), "grad: dtype"),
        (lambda: ef.ef_accumulate(torch.zeros(4), torch.zeros(5), 0.9), "residual: 5 elements"),
        (lambda: ef.ef_accumulate(torch.zeros(4), torch.zeros(4, dtype=torch.float16), 0.9), "residual: dtype"),
        (lambda: ef.ef_accumulate(torch.zeros(4), None, torch.tensor(0.9)), "gamma"),
        (lambda: ef.ef_accumulate(torch.zeros(4), None, 0.9, block=100), "block: 100"),
        (lambda: ef.ef_accumulate_torch(torch.zeros(2, 2), None, 0.9), "grad: expected 1-D"),
    ],
)
def test_bad_input_is_refused_with_field_and_fix(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
