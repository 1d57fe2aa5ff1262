"""DGC's fixes for sparse SGD with momentum (Lin et al., ICLR 2018): momentum correction, momentum-
factor masking and the exponential density warm-up, on bare DDP over gloo.

Oracles: a one-process simulation of DGC's momentum-corrected sparse SGD written here from the
paper's update (u = m u + g; v = v + u; send the Top-K of v; v = 0 and, with masking, u = 0 at the
sent entries; dense sends keep u), the schedule by a hand table, and the uninterrupted run for the
resume.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_strategy.config import CompressionConfig, ConfigError
from hetero_strategy.hooks import CompressedState, topk_hook
from hetero_strategy.hooks.momentum import optimizer_momentum_warning
from hetero_strategy.hooks.schedule import DensitySchedule

SIZES = [200, 120, 64]
M = 0.9
WEIGHTS = [0.25, 0.75]  # b = (1, 3), G = 4
STEPS = 8
DENSE = {0, 1, 5}  # two dense warm-up steps, then the dense sync every 5 steps
# k per parameter at density 0.1: ceil(0.1 n); with the exponential warm-up over 3 steps only step 0
# is dense and the density is 0.1 ** (t / 3) at t = 1, 2: 0.46416 and 0.21544, so by hand
# ceil(0.46416 x (200, 120, 64)) = (93, 56, 30) and ceil(0.21544 x (200, 120, 64)) = (44, 26, 14)
K = [20, 12, 7]
K_EXP = {1: [93, 56, 30], 2: [44, 26, 14]}


class HandGrad(nn.Module):
    """loss = sum_i <p_i, x_i>, so grad p_i = x_i exactly; used out of registration order, so DDP's
    rebuilt buckets differ from its initial ones."""

    def __init__(self) -> None:
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in SIZES])

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return sum((self.ps[i] * xs[i]).sum() for i in [1, 0, 2])


def _grads(step: int, rank: int) -> list[torch.Tensor]:
    return [torch.randn(n, generator=torch.Generator().manual_seed(1000 * step + 10 * rank + i))
            for i, n in enumerate(SIZES)]


def _top(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.argsort(x.abs(), descending=True, stable=True)[:k]


def _state(method: str, masking: bool, warmup: str = "dense") -> CompressedState:
    return CompressedState(method=method, dense_fallback=False, base_density=0.1, density_schedule="constant",
                           dense_warmup_steps=3 if warmup == "exponential" else 2, density_warmup=warmup,
                           dense_sync_every=5, momentum_correction=M, momentum_masking=masking)


def _oracle_worker(rank: int, world: int, method: str, masking: bool, warmup: str) -> None:
    init_gloo(rank, world)
    model = DDP(HandGrad(), bucket_cap_mb=200 * 4 / 2**20)  # ~one parameter per bucket
    state = _state(method, masking, warmup)
    model.register_comm_hook(state, topk_hook)
    u = [[torch.zeros(n) for n in SIZES] for _ in range(world)]  # velocities, per rank and parameter
    v = [[torch.zeros(n) for n in SIZES] for _ in range(world)]  # residuals (accumulated velocity)
    dense_steps = {0, 5} if warmup == "exponential" else DENSE
    for step in range(STEPS):
        state.set_local_batch([1, 3][rank], 4)
        model.zero_grad()
        model([g.clone() for g in _grads(step, rank)]).backward()
        got = [p.grad.clone() for p in model.module.ps]
        for i, n in enumerate(SIZES):
            k = K_EXP.get(step, K)[i] if warmup == "exponential" else K[i]
            want = torch.zeros(n)
            support = torch.nonzero(got[i]).flatten()  # topk_allreduce: the index set the ranks agreed on
            for r in range(world):
                u[r][i] = M * u[r][i] + WEIGHTS[r] * _grads(step, r)[i]
                acc = u[r][i] + v[r][i]
                if step in dense_steps:
                    idx = torch.arange(n)
                else:
                    idx = _top(acc, k) if method == "topk" else support
                    assert idx.numel() == k, f"step {step} p{i}: {idx.numel()} entries sent, not k = {k}"
                want[idx] += acc[idx]
                v[r][i] = acc.clone()
                v[r][i][idx] = 0.0
                if masking and step not in dense_steps:  # dense sends keep their momentum
                    u[r][i][idx] = 0.0
            torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6, msg=f"reduced, step {step} p{i}")
        saved = state.state_dict()
        for i, p in enumerate(model.module.ps):
            key = state.memory.ordinal(p)
            torch.testing.assert_close(saved["velocities"][key], u[rank][i], rtol=1e-5, atol=1e-6,
                                       msg=f"velocity, step {step} p{i}")
            if step >= 2:  # the warm-up keeps no residual
                torch.testing.assert_close(saved["residuals"][key], v[rank][i], rtol=1e-5, atol=1e-6,
                                           msg=f"residual, step {step} p{i}")


@pytest.mark.parametrize(("method", "masking", "warmup"), [
    ("topk", True, "dense"), ("topk", False, "dense"), ("topk_allreduce", True, "dense"),
    ("topk", True, "exponential"),
])
def test_momentum_correction_equals_a_hand_simulation_of_dgc(method: str, masking: bool, warmup: str) -> None:
    """Reduced gradients, velocities and residuals on 2 ranks (unequal batches, a bucket rebuild,
    dense warm-up and dense sync) equal DGC's update done by hand in one process."""
    run_distributed(_oracle_worker, 2, method, masking, warmup, timeout=90)


def _fresh(saved: dict | None = None):
    torch.manual_seed(0)
    model = DDP(HandGrad(), bucket_cap_mb=200 * 4 / 2**20)
    state = _state("topk", True)
    model.register_comm_hook(state, topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: the hook applies it
    if saved is not None:
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state.load_state_dict(saved["hook"])
    return model, state, opt


def _train(model, state, opt, rank: int, steps: range) -> None:
    for step in steps:
        state.set_local_batch([1, 3][rank], 4)
        opt.zero_grad()
        model([g.clone() for g in _grads(step, rank)]).backward()
        opt.step()


def _resume_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    model, state, opt = _fresh()
    _train(model, state, opt, rank, range(STEPS))
    want_w, want = [p.detach().clone() for p in model.parameters()], state.state_dict()
    assert all(u.abs().sum() > 0 for u in want["velocities"].values()), "the run must leave velocities"

    model, state, opt = _fresh()
    _train(model, state, opt, rank, range(3))
    saved = copy.deepcopy({"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()})
    del model, state, opt
    model, state, opt = _fresh(saved)  # new DDP: the initial bucket layout again
    _train(model, state, opt, rank, range(3, STEPS))
    got = state.state_dict()
    for w, w0 in zip(model.parameters(), want_w):
        torch.testing.assert_close(w, w0, rtol=0, atol=1e-7)
    for name in ("velocities", "residuals"):
        assert sorted(got[name]) == sorted(want[name])
        for key in want[name]:
            torch.testing.assert_close(got[name][key], want[name][key], rtol=0, atol=1e-7, msg=f"{name} {key}")


def test_resume_restores_velocities_and_equals_the_uninterrupted_run() -> None:
    run_distributed(_resume_worker, 2, timeout=90)


# DensitySchedule(base 0.01, floor 0.001, 4 warm-up steps, exponential) by hand: step 0 is dense,
# then 0.01 ** (t / 4) = 10 ** (-t / 2): 10 ** -0.5 = 0.316228, 0.1, 10 ** -1.5 = 0.0316228, then 0.01
# (DGC's ramp, geometric per step rather than per epoch). Tier factor 0.5: d_W = 0.005, so
# 0.005 ** (1/4) = 0.265915, 0.005 ** (1/2) = 0.0707107, 0.005 ** (3/4) = 0.0188030.
HAND_RAMP = {1.0: [1.0, 0.316228, 0.1, 0.0316228, 0.01, 0.01], 0.5: [1.0, 0.265915, 0.0707107, 0.0188030, 0.005]}


@pytest.mark.parametrize("tier_factor", HAND_RAMP)
def test_exponential_warmup_follows_a_hand_table(tier_factor: float) -> None:
    s = DensitySchedule(0.01, 0.001, warmup_steps=4, cosine=False, exponential=True)
    got = [s.density(t, tier_factor) for t in range(len(HAND_RAMP[tier_factor]))]
    assert got == pytest.approx(HAND_RAMP[tier_factor], rel=1e-5)
    assert [s.in_warmup(t) for t in range(3)] == [True, False, False]  # step 0 stays dense (bucket rebuild)
    assert s.density(2, None) == 1.0  # a dense tier stays dense
    dense = DensitySchedule(0.01, 0.001, warmup_steps=4, cosine=False)
    assert [dense.density(t, tier_factor) for t in range(5)] == [1.0] * 4 + [0.01 * tier_factor]


def test_compressed_state_modes_under_the_exponential_warmup() -> None:
    state = CompressedState(method="topk", dense_fallback=False, base_density=0.01, density_schedule="constant",
                            dense_warmup_steps=4, density_warmup="exponential")
    assert [state.mode(t) for t in range(3)] == ["warmup", "compressed", "compressed"]
    assert state.plan(2, [10_000]).ks == [math.ceil(0.1 * 10_000)]


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"method": "onebit", "momentum_correction": 0.9}, "momentum_correction=0.9 is invalid: it corrects"),
    ({"method": "topk", "momentum_correction": -0.1}, "momentum_correction=-0.1 is invalid"),
    ({"method": "topk", "momentum_correction": 0.9, "hierarchical": True}, "set hierarchical=False"),
    ({"method": "powersgd", "density_warmup": "exponential"}, "use density_warmup='dense'"),
    ({"method": "topk", "momentum_masking": 1}, "momentum_masking=1 is invalid"),
])
def test_bad_dgc_settings_are_refused_naming_field_and_fix(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        CompressionConfig(**kwargs)


def test_an_optimizer_with_momentum_beside_the_correction_is_warned_about() -> None:
    p = [nn.Parameter(torch.zeros(2))]
    message = optimizer_momentum_warning(0.9, [torch.optim.SGD(p, lr=0.1, momentum=0.9)])
    assert message is not None and "SGD(momentum=0)" in message
    assert optimizer_momentum_warning(0.9, [torch.optim.Adam(p)]) is not None
    assert optimizer_momentum_warning(0.9, [torch.optim.SGD(p, lr=0.1)]) is None
    assert optimizer_momentum_warning(0.0, [torch.optim.SGD(p, lr=0.1, momentum=0.9)]) is None
