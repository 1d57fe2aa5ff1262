"""What a globally skipped step leaves in each rank's error-feedback residuals (docs/compression.md,
"NaN/inf and GradScaler"): the rank whose bucket holds an inf keeps that bucket's old residual
whole, every chunk of it; the finite rank commits its own as on any step. Oracle: per-parameter
Top-K of g + residual written here in plain torch (ef_oracle.top_k), on 2 gloo ranks, one chunk
and three."""

from __future__ import annotations

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from ef_oracle import k_for, top_k
from hetero_bench.flat_bucket import FlatBucket

SIZES = [10, 7, 13]
DENSITY = 0.25


def _grads(rank: int, step: int) -> torch.Tensor:
    g = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(100 * rank + step))
    if rank == 1 and step == 1:
        g[SIZES[0] + 3] = float("inf")  # in the middle parameter only: the other chunks are finite
    return g


def _two_steps(rank: int, world: int, stages: int) -> dict:
    from hetero_strategy.hooks import CompressedState
    from hetero_strategy.hooks.compressed_hooks import _compress

    init_gloo(rank, world)
    state = CompressedState(method="topk", dense_fallback=False, base_density=DENSITY, min_density=DENSITY,
                            density_schedule="constant", dense_warmup_steps=1, dense_sync_every=0,
                            pipeline_stages=stages)
    params = [torch.empty(0) for _ in SIZES]
    out: dict = {"residuals": [], "reduced": []}
    for step in range(2):
        bucket = FlatBucket(_grads(rank, step), params, SIZES)
        out["reduced"].append(_compress(state, bucket, 1, "compressed").wait().clone())
        residual = state.memory.residual(0, state.memory.keys(bucket), bucket.gradients())
        out["residuals"].append(residual.clone())
    return out


def _oracle_residual(g: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    acc = g + residual  # gamma 1
    return torch.cat([a - top_k(a, k_for(a.numel(), DENSITY)) for a in acc.split(SIZES)])


@pytest.mark.parametrize("stages", [1, 3])
def test_a_skipped_step_keeps_the_inf_ranks_residual_and_commits_the_finite_ranks(stages):
    ranks = run_distributed(_two_steps, 2, stages, timeout=60)
    zero = torch.zeros(sum(SIZES))
    after_first = [_oracle_residual(_grads(r, 0), zero) for r in range(2)]
    for r in range(2):
        # step 0: finite everywhere; the reduced gradient is the sum of what both ranks sent
        sent = sum(_grads(q, 0) - after_first[q] for q in range(2))
        torch.testing.assert_close(ranks[r]["reduced"][0], sent, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ranks[r]["residuals"][0], after_first[r], rtol=0, atol=0)
        # step 1: the inf on rank 1 makes the whole bucket NaN on both ranks (the step is skipped)
        assert torch.isnan(ranks[r]["reduced"][1]).all()
    # rank 1 (the inf) keeps its old residual in every parameter, not only the one with the inf
    torch.testing.assert_close(ranks[1]["residuals"][1], after_first[1], rtol=0, atol=0)
    # rank 0 (finite) commits as on any step: what it sent is lost with the skipped step
    torch.testing.assert_close(ranks[0]["residuals"][1], _oracle_residual(_grads(0, 1), after_first[0]),
                               rtol=0, atol=0)
