"""Compressed comm hooks on bare DDP over gloo, against independent oracles (docs/design.md semantics 3, 6-8).

Oracles: the dense weighted gradient sum_r b_r g_r / G computed from per-rank local gradients,
and a ten-line per-parameter error-feedback Top-K written from the formula
sent_t + residual_t = g_t + gamma * residual_{t-1}.
"""

from __future__ import annotations

import copy
import math

import torch
from dist_utils import init_gloo, run_distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_strategy.hooks import (
    CastState,
    CompressedState,
    PowerSGDBaselineState,
    cast_hook,
    onebit_hook,
    powersgd_weighted_hook,
    topk_hook,
)

SIZES = [200, 120, 64]  # parameters of the hand-built model


class HandGrad(nn.Module):
    """loss = sum_i <p_i, x_i>, so grad p_i = x_i exactly; used in an order unlike registration,
    so DDP's rebuilt buckets (gradient-ready order) differ from its initial ones."""

    def __init__(self) -> None:
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in SIZES])

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        order = [1, 0, 2]
        return sum((self.ps[i] * xs[i]).sum() for i in order)


def _grads(step: int, rank: int) -> list[torch.Tensor]:
    """Hand-built gradients: random, then an all-zero step, then a NaN on rank 1 at step 5."""
    if step == 3:
        return [torch.zeros(n) for n in SIZES]
    out = [torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + 10 * rank + i))
           for i, n in enumerate(SIZES)]
    if step == 5 and rank == 1:
        out[1][7] = float("nan")
    return out


def _oracle_topk(acc: torch.Tensor, k: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sent, residual) of one parameter; dense when k x world >= n (payload would exceed dense)."""
    sent = torch.zeros_like(acc)
    if k > 0:
        idx = torch.topk(acc.abs(), k).indices
        sent[idx] = acc[idx]
    return sent, acc - sent


def _bucket_of(layouts: list, step: int, i: int) -> list[int]:
    """Indices of the parameters sharing a bucket with parameter i at ``step`` (sizes are unique)."""
    for st, _, numels in layouts:
        if st == step and SIZES[i] in numels:
            return [SIZES.index(n) for n in numels]
    raise AssertionError(f"parameter {i} was in no bucket at step {step}")


def _ef_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    tiers = ["ib", "eth1g"]  # densities 0.5*0.1 and 0.1*0.1 of base 0.1; eth1g exchanges every 5
    gammas, factors, every = {"ib": 0.9, "eth1g": 0.98}, {"ib": 0.5, "eth1g": 0.1}, {"ib": 1, "eth1g": 5}
    model = DDP(HandGrad(), bucket_cap_mb=200 * 4 / 2**20)  # ~one parameter per bucket
    state = CompressedState(method="tiered", tiers=tiers, dense_fallback=False, base_density=0.1, min_density=0.001,
                            density_schedule="constant", dense_warmup_steps=1, dense_sync_every=0,
                            tier_overrides={t: {"tier_factor": factors[t], "exchange_every": every[t],
                                                "gamma": gammas[t]} for t in tiers})
    layouts = []

    def recording_hook(st, bucket):  # unannotated: this file uses postponed annotations
        layouts.append((st.step, bucket.index(), tuple(p.numel() for p in bucket.parameters())))
        return topk_hook(st, bucket)

    model.register_comm_hook(state, recording_hook)
    weights = [0.25, 0.75]  # unequal batches: b = (1, 3), G = 4
    residual = [[torch.zeros(n) for n in SIZES] for _ in range(world)]
    for step in range(8):
        state.set_local_batch([1, 3][rank], 4)
        model.zero_grad()
        model([g.clone() for g in _grads(step, rank)]).backward()
        expected = [torch.zeros(n) for n in SIZES]
        for r in range(world):
            g = [w * weights[r] for w in _grads(step, r)]
            if step == 0:  # dense warm-up: plain weighted sum, no residual
                expected = [e + x for e, x in zip(expected, g)]
                continue
            accs = [x + gammas[tiers[r]] * res for x, res in zip(g, residual[r])]
            skip = (step - 1) % every[tiers[r]] != 0
            for i, (n, acc) in enumerate(zip(SIZES, accs)):
                ks = [0 if (step - 1) % every[t] else math.ceil(0.1 * factors[t] * n) for t in tiers]
                if max(ks) * world >= n:  # dense parameter
                    sent, res = (torch.zeros_like(acc), acc) if skip else (acc, torch.zeros_like(acc))
                else:
                    sent, res = _oracle_topk(acc, ks[r], world)
                expected[i] += sent
                # a bucket holding a non-finite value keeps its old residual (never stores NaN)
                if all(torch.isfinite(accs[j]).all() for j in _bucket_of(layouts, step, i)):
                    residual[r][i] = res
        got = [p.grad for p in model.module.ps]
        for i in range(len(SIZES)):
            if any(not torch.isfinite(e).all() for e in expected[i:i + 1]) or (
                step == 5 and 1 in _bucket_of(layouts, step, i)
            ):  # rank 1's NaN surfaces on every rank, in the whole bucket it is in
                assert torch.isnan(got[i]).all(), f"a NaN must surface in the reduced bucket (param {i})"
            else:
                torch.testing.assert_close(got[i], expected[i], rtol=1e-5, atol=1e-6, msg=f"step {step} p{i}")
        mine = state.state_dict()["residuals"]
        if step >= 1:
            for p, res in zip(model.module.ps, residual[rank]):
                key = state.memory.ordinal(p)
                torch.testing.assert_close(mine[key], res, rtol=1e-5, atol=1e-6, msg=f"residual step {step}")
    first = [lay for lay in layouts if lay[0] == 0]
    later = [lay for lay in layouts if lay[0] == 2]
    assert [x[2] for x in first] != [x[2] for x in later], f"DDP did not rebuild its buckets: {first} / {later}"
    assert state.last_bytes_sent > 0


def test_error_feedback_tiers_skips_zero_nan_and_rebuild() -> None:
    """Conservation sent + residual = g + gamma*residual per rank with unequal per-rank k (tiers ib and
    eth1g), skipped exchanges (k = 0), an all-zero step, a NaN step, over DDP's bucket rebuild."""
    run_distributed(_ef_worker, 2, timeout=90)


class Net(nn.Module):
    """Layers used in the order a, c, b (registered a, b, c): DDP's buckets change after step 1."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.c(torch.tanh(self.a(x)))))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)


def _dense_equal_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    for method in ("topk", "topk_allreduce", "fp16", "bf16", "powersgd"):
        _dense_equal(rank, world, method)


def _dense_equal(rank: int, world: int, method: str) -> None:
    torch.manual_seed(0)
    ref = Net()
    # PowerSGD (upstream) needs one bucket on gloo; its first 10 iterations are dense by design
    model = DDP(copy.deepcopy(ref), bucket_cap_mb=100 if method == "powersgd" else 0.001)
    if method == "powersgd":
        state = PowerSGDBaselineState(rank=2, start_iter=10)
        model.register_comm_hook(state, powersgd_weighted_hook)
    elif method in ("topk", "topk_allreduce"):
        state = CompressedState(method=method, dense_fallback=False, base_density=1.0, min_density=1.0, dense_warmup_steps=1,
                                dense_sync_every=0)
        model.register_comm_hook(state, topk_hook)
    else:
        state = CastState(dtype=torch.float16 if method == "fp16" else torch.bfloat16)
        model.register_comm_hook(state, cast_hook)
    sizes = [3, 5]  # unequal per-rank batches, G = 8
    lo = sum(sizes[:rank])
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        x, y = _batch(step)
        state.set_local_batch(sizes[rank], 8)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[lo:lo + sizes[rank]]), y[lo:lo + sizes[rank]]).backward()
        # oracle: every rank's local mean-loss gradient, weighted by b_r / G
        ref_opt.zero_grad()
        for p in ref.parameters():
            p.grad = torch.zeros_like(p)
        for r in range(world):
            r_lo = sum(sizes[:r])
            local = copy.deepcopy(ref)
            nn.functional.mse_loss(local(x[r_lo:r_lo + sizes[r]]), y[r_lo:r_lo + sizes[r]]).backward()
            for p, q in zip(ref.parameters(), local.parameters()):
                p.grad += q.grad * sizes[r] / 8
        exact = method in ("topk", "topk_allreduce", "powersgd")
        tol = dict(rtol=1e-5, atol=1e-6) if exact else dict(rtol=2e-2, atol=1e-3)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=f"{method} step {step}")
        opt.step()
        ref_opt.step()
        with torch.no_grad():  # keep the oracle on the trajectory being checked
            for p, q in zip(model.parameters(), ref.parameters()):
                q.copy_(p)


def test_density_one_and_casts_equal_weighted_dense() -> None:
    """Density 1.0 equals the sample-weighted dense reduction to fp32 rounding (over DDP's bucket
    rebuild, unequal batches), and so does the PowerSGD wrapper's dense phase (its weighting);
    the fp16/bf16 casts equal it to half-precision rounding."""
    run_distributed(_dense_equal_worker, 2, timeout=90)


def _train(model: DDP, state: CompressedState, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    sizes = [3, 5]
    lo = sum(sizes[:rank])
    for step in steps:
        x, y = _batch(step)
        state.set_local_batch(sizes[rank], 8)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[lo:lo + sizes[rank]]), y[lo:lo + sizes[rank]]).backward()
        opt.step()


def _fresh(seed_state: dict | None = None) -> tuple[DDP, CompressedState, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = Net()
    if seed_state is not None:
        net.load_state_dict(seed_state["model"])
    model = DDP(net, bucket_cap_mb=0.0005)
    state = CompressedState(method="topk", dense_fallback=False, base_density=0.3, min_density=0.01, density_schedule="cosine",
                            density_period=6, ef_gamma=0.9, dense_warmup_steps=1, dense_sync_every=5,
                            clip_norm=0.5)
    model.register_comm_hook(state, topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if seed_state is not None:
        opt.load_state_dict(seed_state["opt"])
        state.load_state_dict(seed_state["hook"])
    return model, state, opt


def _resume_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    model, state, opt = _fresh()
    _train(model, state, opt, rank, range(8))
    want_w = [p.detach().clone() for p in model.parameters()]
    want_r = state.state_dict()["residuals"]
    assert any(r.abs().sum() > 0 for r in want_r.values()), "the run must leave non-zero residuals"

    model, state, opt = _fresh()
    _train(model, state, opt, rank, range(4))
    saved = copy.deepcopy({"model": model.module.state_dict(), "opt": opt.state_dict(),
                           "hook": state.state_dict()})
    del model, state, opt
    model, state, opt = _fresh(saved)  # new DDP: the initial bucket layout again, not the rebuilt one
    _train(model, state, opt, rank, range(4, 8))
    got_r = state.state_dict()["residuals"]
    assert state.step == 8
    for got, want in zip(model.parameters(), want_w):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    assert sorted(got_r) == sorted(want_r)
    for key in want_r:
        torch.testing.assert_close(got_r[key], want_r[key], rtol=0, atol=1e-7)


def test_checkpoint_resume_reproduces_uninterrupted_run() -> None:
    """state_dict -> fresh DDP + load_state_dict -> the same weights and residuals as never stopping
    (with clipping, a cosine schedule, a dense sync after the resume, several buckets)."""
    run_distributed(_resume_worker, 2, timeout=90)


def _onebit_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    model = DDP(HandGrad())
    state = CompressedState(method="onebit", dense_warmup_steps=1, dense_sync_every=3, ef_gamma=0.8)
    model.register_comm_hook(state, onebit_hook)
    residual = [[torch.zeros(n) for n in SIZES] for _ in range(world)]
    for step in range(5):
        grads = {r: _grads(step + 10, r) for r in range(world)}  # step + 10: no zero/NaN steps here
        state.set_local_batch(1, 2)
        model.zero_grad()
        model([g.clone() for g in grads[rank]]).backward()
        expected = [torch.zeros(n) for n in SIZES]
        for r in range(world):
            for i in range(len(SIZES)):
                g = grads[r][i] * 0.5
                if step == 0:  # dense warm-up
                    expected[i] += g
                    continue
                acc = g + 0.8 * residual[r][i]
                sent = acc if step == 3 else acc.abs().mean() * torch.where(acc >= 0, 1.0, -1.0)
                expected[i] += sent
                residual[r][i] = acc - sent
        for i, p in enumerate(model.module.ps):
            torch.testing.assert_close(p.grad, expected[i], rtol=1e-5, atol=1e-6, msg=f"step {step} p{i}")
    assert state.last_modes and set(state.last_modes.values()) == {"onebit"}


def test_onebit_signs_with_per_parameter_scales_and_dense_sync() -> None:
    """1-bit: sum over ranks of mean|acc_p| * sign(acc) per parameter, error feedback with gamma,
    and the periodic dense sync (step 3) that sends everything and flushes the residual."""
    run_distributed(_onebit_worker, 2, timeout=90)
