"""Every compression method the factory builds, run on a hand-built bucket in a real one-process gloo
group, against the dense all-reduce and against hand-worked Top-K, 1-bit and PowerSGD results."""

from __future__ import annotations

import pytest
import torch
from hetero_bench.flat_bucket import FlatBucket

from hetero_strategy.config import COMPRESSION_METHODS, HeteroConfig
from hetero_strategy.hooks import build_comm_hook


def _bucket(params: list[torch.Tensor], values: list[torch.Tensor]) -> FlatBucket:
    """A bucket of ``params`` holding ``values`` as its gradients."""
    return FlatBucket(torch.cat([v.reshape(-1) for v in values]), params)


@pytest.fixture
def world_of_one():
    """A real single-process gloo group, so every hook runs its collectives (PowerSGD needs one)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# A hand-built bucket: a (2, 3) weight and a (3,) bias; this rank holds 1 of 4 samples, so the
# reduction weight is 1/4 and the weighted gradient is the numbers on the right. 1 + 2^-9 needs 9
# mantissa bits: fp16 (10) keeps it, bf16 (7) rounds it to 1.
_GRAD = [torch.tensor([[4.0, -8.0, 2.0], [8.0, -16.0, 4.0]]), torch.tensor([4.0 + 2**-7, -2.0, 0.5])]
_WEIGHTED = torch.tensor([1.0, -2.0, 0.5, 2.0, -4.0, 1.0, 1.0 + 2**-9, -0.5, 0.125])


def _factory_steps(method: str, steps: int, **flat) -> tuple[object, list[torch.Tensor]]:
    params = [torch.zeros(2, 3), torch.zeros(3)]
    # auto measures the model (a one-rank world: it exchanges densely)
    state, hook = build_comm_hook(HeteroConfig.from_flat(compression=method, **flat), model=torch.nn.ParameterList(params))
    assert hook.__name__ not in ("bf16_compress_hook",)  # DDP refuses that name off CUDA
    outs = []
    for _ in range(steps):
        state.set_local_batch(1, 4)
        outs.append(hook(state, _bucket(params, [g.clone() for g in _GRAD])).wait().clone())
    return state, outs


def _dense_all_reduce(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    import torch.distributed as dist

    wire = _WEIGHTED.to(dtype)
    dist.all_reduce(wire)
    return wire.float()


@pytest.mark.parametrize("method", COMPRESSION_METHODS)
def test_every_method_from_the_factory_equals_dense_all_reduce_while_dense(method: str, world_of_one) -> None:
    """Warm-up (Top-K, 1-bit), PowerSGD's first iterations and the plain/cast hooks: the dense all-reduce."""
    wire = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(method, torch.float32)
    _state, outs = _factory_steps(method, 2, dense_warmup_steps=2, tier="ib")
    for out in outs:
        assert torch.equal(out, _dense_all_reduce(wire)), (method, out)
    if method == "bf16":  # the cast really happened
        assert out[6] == 1.0 and not torch.equal(out, _WEIGHTED)


@pytest.mark.parametrize("method", ["none", "fp16", "topk", "tiered"])
def test_density_one_and_plain_hooks_stay_the_dense_all_reduce(method: str, world_of_one) -> None:
    """docs/design.md semantics 6: with density 1.0 the Top-K hooks equal the dense all-reduce."""
    _state, outs = _factory_steps(method, 4, dense_warmup_steps=1, base_density=1.0, density_schedule="constant",
                                  tier="ib")
    for out in outs:
        assert torch.equal(out, _dense_all_reduce()), (method, out)


@pytest.mark.parametrize("method", ["topk", "tiered"])
def test_topk_from_the_factory_sends_the_hand_picked_entries(method: str, world_of_one) -> None:
    # constant density 0.34: k = ceil(0.34 x 6) = 3 of the weight, ceil(0.34 x 3) = 2 of the bias.
    # step 1 (after one dense step): weight |1 2 .5 2 4 1| -> -4, -2, 2 (indices 4, 1, 3);
    #   bias |1.002 .5 .125| -> 1.002, -0.5; residual = the rest: [1, 0, .5, 0, 0, 1 | 0, 0, .125]
    # step 2: acc = g + residual = [2, -2, 1, 2, -4, 2 | 1.002, -0.5, 0.25] -> -4, then the first two
    #   of the four 2s in index order (0, 1); the bias again 1.002, -0.5
    state, outs = _factory_steps(method, 3, dense_warmup_steps=1, base_density=0.34, min_density=0.34,
                                 density_schedule="constant", tier="ib", ef_gamma=1.0)
    b0 = 1.0 + 2**-9
    assert torch.equal(outs[0], _WEIGHTED)
    assert outs[1].tolist() == [0.0, -2.0, 0.0, 2.0, -4.0, 0.0, b0, -0.5, 0.0]
    assert outs[2].tolist() == [2.0, -2.0, 0.0, 0.0, -4.0, 0.0, b0, -0.5, 0.0]
    residual = torch.cat(list(state.state_dict()["residuals"].values()))
    assert residual.tolist() == [0.0, 0.0, 1.0, 2.0, 0.0, 2.0, 0.0, 0.0, 0.25]  # acc - sent


def test_onebit_from_the_factory_sends_sign_times_mean_magnitude(world_of_one) -> None:
    # per parameter: the weight's mean |x| = (1 + 2 + .5 + 2 + 4 + 1) / 6 = 1.75; the bias's
    # (1.001953125 + .5 + .125) / 3 = 0.5423177...; each entry goes out as sign x that mean
    state, outs = _factory_steps("onebit", 2, dense_warmup_steps=1)
    assert torch.equal(outs[0], _WEIGHTED)
    m = 1.626953125 / 3
    torch.testing.assert_close(outs[1], torch.tensor([1.75, -1.75, 1.75, 1.75, -1.75, 1.75, m, -m, m]))
    residual = torch.cat(list(state.state_dict()["residuals"].values()))
    torch.testing.assert_close(outs[1] + residual, _WEIGHTED)


def test_powersgd_from_the_factory_recovers_a_rank_one_gradient(world_of_one) -> None:
    """After its 2 dense iterations PowerSGD (rank 1) compresses an (8, 8) rank-1 gradient: P Q^T
    spans it exactly, so the result is the weighted gradient (to fp32 rounding), not an approximation."""
    state, hook = build_comm_hook(HeteroConfig.from_flat(compression="powersgd", powersgd_rank=1,
                                                             dense_warmup_steps=2))
    u, v = torch.arange(1.0, 9.0), torch.tensor([1.0, -1.0, 2.0, 0.5, -3.0, 1.0, 0.25, 4.0])
    grads = [torch.outer(u, v), torch.tensor([8.0, -4.0])]  # 64 > (8 + 8) x 1: the weight is compressed
    params = [torch.zeros(8, 8), torch.zeros(2)]
    want = torch.cat([g.reshape(-1) for g in grads]) / 4
    for step in range(3):
        state.set_local_batch(1, 4)
        out = hook(state, _bucket(params, [g.clone() for g in grads])).wait()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        assert bool(state.powersgd.p_memory_dict) == (step == 2), step  # compressed at step 2 only
