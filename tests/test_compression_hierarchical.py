"""Hierarchical compression on gloo ranks in two fast groups ("nodes"), against a hand-written
oracle: dense weighted sums inside each group, error-feedback Top-K between the leaders. Nodes
of 2 + 2 ranks, and uneven nodes of 1 + 2 ranks (one node with fewer GPUs)."""

from __future__ import annotations

import math

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_strategy.hooks import CompressedState, topk_hook

SIZES = [300, 40]


class HandGrad(nn.Module):
    """loss = sum_i <p_i, x_i>: grad p_i = x_i exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in SIZES])

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * x).sum() for p, x in zip(self.ps, xs))


def _grads(step: int, rank: int) -> list[torch.Tensor]:
    return [torch.randn(n, generator=torch.Generator().manual_seed(100 * step + 10 * rank + i))
            for i, n in enumerate(SIZES)]


def _worker(rank: int, world: int, groups: list[list[int]], batch: list[int]) -> None:
    """``batch``: unequal per-rank batches with G = 8."""
    init_gloo(rank, world)
    leaders = [g[0] for g in groups]
    dense = DDP(HandGrad())
    dense_state = CompressedState(method="topk", dense_fallback=False, base_density=1.0, min_density=1.0, dense_warmup_steps=1,
                                  hierarchical=True, fast_groups=groups)
    dense.register_comm_hook(dense_state, topk_hook)
    sparse = DDP(HandGrad())
    state = CompressedState(method="topk", dense_fallback=False, base_density=0.05, min_density=0.05, density_schedule="constant",
                            dense_warmup_steps=1, dense_sync_every=0, ef_gamma=0.9, hierarchical=True,
                            fast_groups=groups)
    sparse.register_comm_hook(state, topk_hook)
    residual = {leader: [torch.zeros(n) for n in SIZES] for leader in leaders}
    for step in range(4):
        weighted = {r: [g * batch[r] / 8 for g in _grads(step, r)] for r in range(world)}
        total = [sum(weighted[r][i] for r in range(world)) for i in range(len(SIZES))]
        expected = [torch.zeros(n) for n in SIZES]
        for group in groups:
            group_sum = [sum(weighted[r][i] for r in group) for i in range(len(SIZES))]
            for i, n in enumerate(SIZES):
                if step == 0:
                    expected[i] += group_sum[i]
                    continue
                acc = group_sum[i] + 0.9 * residual[group[0]][i]
                k = math.ceil(0.05 * n)
                sent = acc.clone() if k * len(leaders) >= n else torch.zeros_like(acc)
                if k * len(leaders) < n:
                    idx = torch.topk(acc.abs(), k).indices
                    sent[idx] = acc[idx]
                residual[group[0]][i] = acc - sent
                expected[i] += sent
        for model, st in ((dense, dense_state), (sparse, state)):
            st.set_local_batch(batch[rank], 8)
            model.zero_grad()
            model([g.clone() for g in _grads(step, rank)]).backward()
        for i in range(len(SIZES)):
            torch.testing.assert_close(dense.module.ps[i].grad, total[i], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(sparse.module.ps[i].grad, expected[i], rtol=1e-5, atol=1e-6,
                                       msg=f"step {step} param {i}")
        if rank in leaders and step > 0:
            mine = state.state_dict()["residuals"]
            for p, want in zip(sparse.module.ps, residual[rank]):
                torch.testing.assert_close(mine[state.memory.ordinal(p)], want, rtol=1e-5, atol=1e-6)
    assert state.last_bytes_sent > 0


@pytest.mark.parametrize(("groups", "batch"), [
    ([[0, 1], [2, 3]], [1, 2, 3, 2]),
    ([[0], [1, 2]], [3, 2, 3]),  # uneven nodes: 1 process on one, 2 on the other
])
def test_hierarchical_dense_inside_groups_topk_between_leaders(groups, batch) -> None:
    """Density 1.0 equals the weighted dense sum; sparse equals group sums + leaders' EF Top-K,
    and every rank of a group receives its leader's result."""
    run_distributed(_worker, sum(map(len, groups)), groups, batch, timeout=120)
