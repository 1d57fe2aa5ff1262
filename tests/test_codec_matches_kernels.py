"""The hooks' CPU Top-K selects exactly what the kernels' torch reference (and so Triton) selects."""

from __future__ import annotations

import pytest
import torch
from hetero_strategy.triton_kernels import dispatch

from hetero_strategy.hooks.codecs import TopKCodec


@pytest.mark.parametrize("n, k", [(70_000, 700), (200_003, 1), (200_003, 5_000), (1_000, 10), (300_000, 14_000)])
@pytest.mark.parametrize("ties", [False, True])
def test_cpu_codec_equals_reference_selection(n, k, ties):
    g = torch.Generator().manual_seed(n + k)
    acc = torch.randn(n, generator=g)
    if ties:  # many equal magnitudes (both signs) straddling the k-th value, plus exact zeros
        acc = torch.round(acc * 4) / 4
        acc[::7] = 0.0
    ref_values, ref_indices, ref_count, ref_residual = dispatch.topk_select(acc.clone(), k, k, backend="torch")
    mine = acc.clone()
    values, indices = TopKCodec.select_(mine, k, k, backend="torch")
    assert int(ref_count) == k
    assert torch.equal(indices, ref_indices)
    assert torch.equal(values, ref_values)
    assert torch.equal(mine, ref_residual)
