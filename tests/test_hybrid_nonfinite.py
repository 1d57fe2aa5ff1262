"""A non-finite model delta in hybrid mode, handled as the DDP hook handles a non-finite bucket
(docs/reliability.md, "Non-finite gradients"; docs/compression.md, "NaN/inf and GradScaler"): the
NaN/inf never reaches a residual (the rank keeps its last finite one), it surfaces alike on every
rank, and the models stay finite and identical across ranks.

Oracle: Top-K with error feedback written here in plain torch (``acc.abs().topk(k)``), on 2 gloo
ranks: first the delta exchange itself, then whole hybrid periods where rank 1 diverges.
"""

from __future__ import annotations

import math

import torch
from dist_utils import init_gloo, run_distributed
from hybrid_steps import flat_params, regression_step, sparse_hybrid_rank

NUMEL, DENSITY = 40, 0.2
K = math.ceil(DENSITY * NUMEL)  # 8 of 40 per rank: density x world size < 1, so sparse


def _topk_ef(acc: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sent, residual): acc at its k largest magnitudes, and what stays behind."""
    sent = torch.zeros_like(acc)
    top = acc.abs().topk(k).indices
    sent[top] = acc[top]
    return sent, acc - sent


# ---- 1. the exchange: a NaN delta on one rank ------------------------------------------------
def _delta(rank: int, call: int) -> torch.Tensor:
    d = torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 * rank + call))
    if rank == 1 and call == 1:
        d[5] = float("inf")
    return d


def _three_exchanges(rank: int, world: int) -> dict:
    from hetero_strategy.hybrid import DeltaExchange

    init_gloo(rank, world)
    exchange = DeltaExchange(DENSITY, world)
    out: dict = {"sums": [], "residuals": []}
    for call in range(3):
        out["sums"].append(exchange.reduce(_delta(rank, call)).clone())
        out["residuals"].append(exchange.state_dict()["residual"].clone())
    return out


def test_a_nonfinite_delta_comes_back_nan_everywhere_and_its_rank_keeps_its_residual():
    ranks = run_distributed(_three_exchanges, 2, timeout=60)
    sent0, res0 = zip(*(_topk_ef(_delta(r, 0), K) for r in range(2)))
    for r in range(2):
        torch.testing.assert_close(ranks[r]["sums"][0], sent0[0] + sent0[1], rtol=0, atol=1e-6)
        torch.testing.assert_close(ranks[r]["residuals"][0], res0[r], rtol=0, atol=0)
        # the inf on rank 1 makes the whole sum NaN on both ranks, as the DDP hook marks a bucket
        assert torch.isnan(ranks[r]["sums"][1]).all()
    # rank 1 keeps its last finite residual whole; rank 0 (finite) commits as on any exchange
    torch.testing.assert_close(ranks[1]["residuals"][1], res0[1], rtol=0, atol=0)
    _, res1_r0 = _topk_ef(_delta(0, 1) + res0[0], K)
    torch.testing.assert_close(ranks[0]["residuals"][1], res1_r0, rtol=0, atol=0)
    # the next exchange goes on from those residuals: nothing of the NaN is left anywhere
    sent2 = [_topk_ef(_delta(0, 2) + res1_r0, K), _topk_ef(_delta(1, 2) + res0[1], K)]
    for r in range(2):
        torch.testing.assert_close(ranks[r]["sums"][2], sent2[0][0] + sent2[1][0], rtol=0, atol=1e-6)
        torch.testing.assert_close(ranks[r]["residuals"][2], sent2[r][1], rtol=0, atol=0)


# ---- 2. whole periods: rank 1's model diverges in the second one ----------------------------
SYNCS, BATCH = 3, (3, 5)


def _diverging(rank: int, world: int) -> dict:
    import torch.distributed as dist

    runtime, net, ddp, opt = sparse_hybrid_rank(rank, world, DENSITY)
    g = torch.Generator().manual_seed(rank)
    syncs = [{"after": flat_params(net)}]
    while runtime.checkpoint_step() < SYNCS:
        regression_step(runtime, ddp, opt, torch.randn(BATCH[rank], 5, generator=g))
        controller = runtime.hybrid.controller
        if rank == 1 and controller.syncs == 1 and controller.count == 0:  # inside the second period
            with torch.no_grad():
                net[0].weight.fill_(float("nan"))
        before = flat_params(net)
        dist.barrier()  # lockstep: both ranks reach H = 2 in every period
        runtime.step_end(samples=BATCH[rank])
        if runtime.synced:
            residual = controller.exchange.state_dict()["residual"]
            syncs.append({"before": before, "after": flat_params(net), "residual": residual.clone(), **controller.last})
    return {"syncs": syncs}


def test_a_diverged_period_weighs_nothing_and_no_nan_reaches_a_model_or_residual():
    out = run_distributed(_diverging, 2, timeout=90)
    numel = out[0]["syncs"][0]["after"].numel()
    k = math.ceil(DENSITY * numel)
    residual = [torch.zeros(numel), torch.zeros(numel)]
    anchor = out[0]["syncs"][0]["after"]
    for i in range(1, SYNCS + 1):
        diverged = i == 2
        assert torch.isnan(out[1]["syncs"][i]["before"]).any() == diverged
        w = [1.0, 0.0] if diverged else [b / sum(BATCH) for b in BATCH]  # rank 1's NaN period weighs 0
        assert out[0]["syncs"][i]["weights"] == w
        total = torch.zeros(numel)
        for r in range(2):
            delta = torch.zeros(numel) if w[r] == 0 else (out[r]["syncs"][i]["before"] - anchor).mul_(w[r])
            sent, residual[r] = _topk_ef(delta + residual[r], k)
            total += sent
        anchor = anchor + total
        for r in range(2):
            sync = out[r]["syncs"][i]
            assert torch.isfinite(sync["after"]).all() and torch.isfinite(sync["residual"]).all()
            torch.testing.assert_close(sync["after"], anchor, rtol=0, atol=1e-6)
            torch.testing.assert_close(sync["residual"], residual[r], rtol=0, atol=1e-6)
        assert torch.equal(out[0]["syncs"][i]["after"], out[1]["syncs"][i]["after"])  # one model
        anchor = out[0]["syncs"][i]["after"]
