"""``selection="threshold"`` (Ok-Topk's threshold reuse) on bare DDP over 2 gloo ranks.

Oracle: the rule in plain torch, by magnitudes, per rank and parameter: every ``EVERY``
selections the threshold is the k-th largest |acc| (a sort); in between it is reused; a rank
sends every entry at or above it, the first ``cap`` in index order, and keeps the rest:
sent_t + residual_t = w_r g_t + residual_{t-1} (docs/design.md semantics 6). The gradients grow
from step to step, so a reused threshold lets more than k through, and the metrics must say so.
"""

from __future__ import annotations

import io
import math

import torch
from dist_utils import init_gloo, run_distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_strategy.hooks import CompressedState, topk_hook

SIZES = [200, 120, 64]
WEIGHTS = [0.25, 0.75]  # b = (1, 3), G = 4
DENSITY, EVERY, HEADROOM, STEPS = 0.1, 3, 1.5, 7


class HandGrad(nn.Module):
    """loss = sum_i <p_i, x_i>, so grad p_i = x_i; used out of registration order (DDP rebuilds)."""

    def __init__(self) -> None:
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in SIZES])

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return sum((self.ps[i] * xs[i]).sum() for i in (1, 0, 2))


def _grads(step: int, rank: int) -> list[torch.Tensor]:
    grow = 1.0 + 0.5 * step  # magnitudes grow between re-estimates
    return [grow * torch.randn(n, generator=torch.Generator().manual_seed(100 * step + 10 * rank + i))
            for i, n in enumerate(SIZES)]


def _state() -> CompressedState:
    return CompressedState(method="topk", selection="threshold", threshold_every=EVERY, threshold_headroom=HEADROOM,
                           base_density=DENSITY, density_schedule="constant", dense_warmup_steps=1,
                           dense_sync_every=0, dense_fallback=False)


def _model() -> tuple[DDP, CompressedState, torch.optim.Optimizer]:
    model = DDP(HandGrad(), bucket_cap_mb=200 * 4 / 2**20)  # about one parameter per bucket
    state = _state()
    model.register_comm_hook(state, topk_hook)
    return model, state, torch.optim.SGD(model.parameters(), lr=0.1)


def _step(model: DDP, state: CompressedState, opt: torch.optim.Optimizer, step: int, rank: int) -> None:
    state.set_local_batch([1, 3][rank], 4)
    opt.zero_grad()
    model([g.clone() for g in _grads(step, rank)]).backward()
    opt.step()


class _Oracle:
    """Threshold reuse by the formula, for every rank (magnitudes and a sort, no kernel)."""

    def __init__(self, world: int) -> None:
        self.residual = [[torch.zeros(n) for n in SIZES] for _ in range(world)]
        self.thr: dict[tuple[int, int], float] = {}
        self.count: dict[tuple[int, int], int] = {}

    def step(self, step: int) -> tuple[list[torch.Tensor], list[int]]:
        """(the reduced gradient per parameter, entries each rank sent) of ``step``."""
        total = [torch.zeros(n) for n in SIZES]
        sent_by_rank = []
        for r, w in enumerate(WEIGHTS):
            grads = [w * g for g in _grads(step, r)]
            if step == 0:  # dense warm-up
                total = [t + g for t, g in zip(total, grads)]
                sent_by_rank.append(sum(SIZES))
                continue
            entries = 0
            for i, (n, g) in enumerate(zip(SIZES, grads)):
                acc = g + self.residual[r][i]
                k = math.ceil(DENSITY * n)
                if self.count.get((r, i), 0) % EVERY == 0:  # re-estimate: the exact k-th magnitude
                    self.thr[r, i] = acc.abs().sort(descending=True).values[k - 1].item()
                self.count[r, i] = self.count.get((r, i), 0) + 1
                picked = torch.nonzero(acc.abs() >= self.thr[r, i]).flatten()[:math.ceil(HEADROOM * k)]
                sent = torch.zeros(n)
                sent[picked] = acc[picked]
                self.residual[r][i] = torch.where(sent != 0, torch.zeros(n), acc)
                total[i] += sent
                entries += picked.numel()
            sent_by_rank.append(entries)
        return total, sent_by_rank


def _worker(rank: int, world: int) -> dict:
    init_gloo(rank, world)
    torch.manual_seed(0)
    model, state, opt = _model()
    oracle = _Oracle(world)
    planned = sum(math.ceil(DENSITY * n) for n in SIZES)
    counts = []
    for step in range(STEPS):
        _step(model, state, opt, step, rank)
        expected, sent = oracle.step(step)
        for i, p in enumerate(model.module.ps):
            torch.testing.assert_close(p.grad, expected[i], rtol=1e-6, atol=1e-6, msg=f"step {step} p{i}")
            if step > 0:  # the warm-up keeps no residual
                mine = state.state_dict()["residuals"][state.memory.ordinal(p)]
                torch.testing.assert_close(mine, oracle.residual[rank][i], rtol=1e-6, atol=1e-6)
        metrics = state.metrics()
        assert metrics["comm/entries_sent"] == sent[rank], (step, metrics, sent)
        assert metrics["comm/density_sent"] == sent[rank] / sum(SIZES)
        if step > 0:
            assert metrics["comm/density"] == planned / sum(SIZES)  # the plan does not move
        counts.append(sent[rank])
    # a re-estimate sends exactly k (no ties in random data); a reused threshold lets more through
    assert counts[1] == counts[4] == planned, counts
    assert counts[3] > planned and counts[6] > planned, counts
    return {"params": [p.detach().clone() for p in model.module.ps], "thresholds": state.state_dict()["thresholds"],
            "resumed": _resumed(rank), "counts": counts}


def _resumed(rank: int) -> dict:
    """Stop after 4 steps, checkpoint, rebuild everything, load and finish: what the full run ends with."""
    model, state, opt = _model()
    for step in range(4):
        _step(model, state, opt, step, rank)
    buf = io.BytesIO()
    torch.save({"hook": state.state_dict(), "params": [p.detach().clone() for p in model.module.ps]}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    model, state, opt = _model()
    with torch.no_grad():
        for p, q in zip(model.module.ps, saved["params"]):
            p.copy_(q)
    state.load_state_dict(saved["hook"])
    for step in range(4, STEPS):
        _step(model, state, opt, step, rank)
    return {"params": [p.detach().clone() for p in model.module.ps], "thresholds": state.state_dict()["thresholds"]}


def test_threshold_reuse_keeps_error_feedback_exact_reports_drift_and_resumes_alike() -> None:
    results = run_distributed(_worker, 2, timeout=120)
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(a, b), "ranks must hold bitwise identical parameters"
    for r in results:
        for a, b in zip(r["params"], r["resumed"]["params"]):
            assert torch.equal(a, b), "a resumed run must end where the uninterrupted one does"
        assert r["thresholds"] == r["resumed"]["thresholds"]
        assert set(r["thresholds"]["ages"].values()) == {(STEPS - 1) % EVERY or EVERY}
    assert results[0]["counts"] != results[1]["counts"]  # each rank measures its own
