"""Hybrid syncs with Top-K compressed deltas and error feedback, against a hand simulation; on
entering the synchronous phase what the residuals held back is sent, so nothing is lost."""

from __future__ import annotations

import math

import torch
from dist_utils import run_distributed
from hybrid_steps import flat_params, regression_step, sparse_hybrid_rank

DENSITY, SYNCS, BATCH = 0.2, 3, (3, 5)


def _sparse(rank: int, world: int, codec: str = "topk") -> dict:
    import torch.distributed as dist

    runtime, net, ddp, opt = sparse_hybrid_rank(rank, world, DENSITY, codec)
    g = torch.Generator().manual_seed(rank)
    syncs = [{"after": flat_params(net)}]
    while runtime.checkpoint_step() < SYNCS:
        x = torch.randn(BATCH[rank], 5, generator=g)
        regression_step(runtime, ddp, opt, x)
        before = flat_params(net)
        runtime.step_end(samples=len(x))
        if runtime.synced:
            controller = runtime.hybrid.controller
            syncs.append({"before": before, "after": flat_params(net), "bytes": controller.exchange.bytes_sent,
                          **controller.last})
        dist.barrier()  # equal speeds made exact: both ranks reach H = 2 in every period
    assert not runtime.evaluated(1.0) and runtime.evaluated(1.0)  # a flat loss: the synchronous phase
    return {"syncs": syncs, "synchronous": flat_params(net)}


def test_topk_deltas_with_error_feedback_match_a_hand_simulation():
    out = run_distributed(_sparse, 2, timeout=60)
    numel = out[0]["syncs"][0]["after"].numel()
    k = math.ceil(DENSITY * numel)
    residual = [torch.zeros(numel), torch.zeros(numel)]
    anchor = out[0]["syncs"][0]["after"]
    for i in range(1, SYNCS + 1):
        assert out[0]["syncs"][i]["steps"] == [2, 2] and out[0]["syncs"][i]["bytes"] == 4 * 2 * k < 4 * numel
        w = [b / sum(BATCH) for b in BATCH]  # equal steps: the sample shares
        total = torch.zeros(numel)
        for r in range(2):
            acc = (out[r]["syncs"][i]["before"] - anchor).mul_(w[r]) + residual[r]
            sent = torch.zeros(numel)
            top = acc.abs().topk(k).indices
            sent[top] = acc[top]
            residual[r] = acc - sent  # kept for the next sync: delayed, not dropped
            total += sent
        want = anchor + total
        for r in range(2):
            torch.testing.assert_close(out[r]["syncs"][i]["after"], want, rtol=0, atol=1e-6)
        anchor = out[0]["syncs"][i]["after"]
    assert all(res.abs().sum() > 0 for res in residual)  # the test exercised the feedback
    for r in range(2):  # the residuals, sent densely on the way into the synchronous phase
        torch.testing.assert_close(out[r]["synchronous"], anchor + residual[0] + residual[1], rtol=0, atol=1e-6)


def test_shared_index_deltas_match_a_hand_simulation():
    """delta_codec="topk_allreduce": at each sync both ranks send at one index set; the first sync's
    is rank 0's top-k of its accumulator, each later one the top-k of the next leader's (rank 1,
    rank 0, ...) residual after the previous sync; the rest stays in each rank's residual."""
    out = run_distributed(_sparse, 2, "topk_allreduce", timeout=60)
    numel = out[0]["syncs"][0]["after"].numel()
    k = math.ceil(DENSITY * numel)
    residual = [torch.zeros(numel), torch.zeros(numel)]
    anchor, agreed = out[0]["syncs"][0]["after"], None
    w = [b / sum(BATCH) for b in BATCH]
    for i in range(1, SYNCS + 1):
        assert out[0]["syncs"][i]["steps"] == [2, 2]
        accs = [(out[r]["syncs"][i]["before"] - anchor).mul_(w[r]) + residual[r] for r in range(2)]
        if agreed is None:
            agreed = accs[0].abs().topk(k).indices
        total = torch.zeros(numel)
        for r in range(2):
            total[agreed] += accs[r][agreed]
            residual[r] = accs[r].clone()
            residual[r][agreed] = 0.0
        for r in range(2):
            torch.testing.assert_close(out[r]["syncs"][i]["after"], anchor + total, rtol=0, atol=1e-6)
        agreed = residual[i % 2].abs().topk(k).indices  # the next leader's proposal
        anchor = out[0]["syncs"][i]["after"]
    assert all(res.abs().sum() > 0 for res in residual)
    for r in range(2):
        torch.testing.assert_close(out[r]["synchronous"], anchor + residual[0] + residual[1], rtol=0, atol=1e-6)
