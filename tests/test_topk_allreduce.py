"""compression="topk_allreduce": Top-K at one index set all ranks share, summed by one all-reduce.

Oracles: a one-process simulation of the rotating-leader protocol written here from its
description in docs/compression.md (not from hooks/shared_indices.py), the error-feedback identity
sent + new residual = old residual + gradient checked on each rank's real state, a dense
all-reduce at density 1.0, and an uninterrupted run for the resume.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from dist_utils import init_gloo, run_distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_strategy.hooks import CompressedState, TopKPlan, TopKState, topk_ef_exchange, topk_hook

SIZES = [40, 25, 16]  # three segments of one flat tensor
# per call: this call's k per segment (the rise at call 3 forces a bootstrap of segment 0)
KS = [[4, 3, 2], [4, 3, 2], [3, 3, 2], [8, 3, 2], [8, 2, 2], [8, 2, 1]]
SKIP = {(2, 1)}  # (call, rank): that rank sends zeros at the agreed indices and keeps its accumulator
NAN = {(4, 2)}  # (call, rank): a NaN in that rank's gradient
GAMMA = 0.9


def _grad(call: int, rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * call + rank)
    out = [torch.randn(n, generator=gen) for n in SIZES]
    if (call, rank) in NAN:
        out[1][3] = float("nan")
    return out


def _top(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.argsort(x.abs(), descending=True, stable=True)[:k]


def _simulate(world: int) -> tuple[list[list[torch.Tensor]], list[list[list[torch.Tensor]]]]:
    """(summed segments per call, every rank's residual per call) of the protocol, in one process.

    The protocol: every segment is sent at every call here, so its leader at call t is t mod W. Each segment sends at the agreed indices, the
    first k of them; if none are agreed, or fewer than k, the leader's top-k of its accumulator
    is agreed first. After the call, the next leader agrees its top-k of its new residual. A rank
    with a non-finite accumulator keeps its old residual; the sum is then NaN everywhere.
    """
    res = [[torch.zeros(n) for n in SIZES] for _ in range(world)]
    agreed: dict[int, torch.Tensor] = {}
    sums, residuals = [], []
    for call, ks in enumerate(KS):
        accs = [[g + GAMMA * r for g, r in zip(_grad(call, rank), res[rank])] for rank in range(world)]
        leader = call % world
        for j, k in enumerate(ks):
            if j not in agreed or agreed[j].numel() < k:
                agreed[j] = _top(accs[leader][j], k)
        idx = [agreed[j][:k] for j, k in enumerate(ks)]
        total = [torch.zeros(n) for n in SIZES]
        for rank in range(world):
            if (call, rank) in SKIP:
                continue
            for j in range(len(SIZES)):
                total[j][idx[j]] += accs[rank][j][idx[j]]
        for rank in range(world):
            if not all(torch.isfinite(a).all() for a in accs[rank]):
                continue  # the old residual stays
            kept = [a.clone() for a in accs[rank]]
            if (call, rank) not in SKIP:
                for j in range(len(SIZES)):
                    kept[j][idx[j]] = 0.0
            res[rank] = kept
        nxt = (call + 1) % world
        agreed = {j: _top(res[nxt][j], k) for j, k in enumerate(ks)}
        sums.append(total)
        residuals.append([[r.clone() for r in rr] for rr in res])
    return sums, residuals


def _exchange_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    sums, residuals = _simulate(world)
    state = TopKState(shared_indices=True, backend="torch")
    keys = tuple(range(len(SIZES)))
    for call, ks in enumerate(KS):
        before = [state.memory.state_dict()["residuals"].get(j, torch.zeros(n)) for j, n in enumerate(SIZES)]
        grad = _grad(call, rank)
        mine = [0] * len(ks) if (call, rank) in SKIP else ks
        plan = TopKPlan([True] * len(SIZES), mine, ks, [False] * len(SIZES))
        out = topk_ef_exchange(state, 0, keys, torch.cat(grad), SIZES, plan, gamma=GAMMA).wait()
        if any(c == call for c, _ in NAN):
            assert torch.isnan(out).all(), f"call {call}: a rank's NaN must surface in the whole sum"
        else:
            torch.testing.assert_close(out, torch.cat(sums[call]), rtol=1e-5, atol=1e-6, msg=f"sum, call {call}")
            support = [torch.nonzero(s).flatten() for s in out.split(SIZES)]
            assert [s.numel() for s in support] == ks, f"call {call}: one shared set of k indices per segment"
        after = [state.memory.state_dict()["residuals"][j] for j in range(len(SIZES))]
        for j in range(len(SIZES)):
            torch.testing.assert_close(after[j], residuals[call][rank][j], rtol=1e-5, atol=1e-6,
                                       msg=f"residual, call {call}, segment {j}")
            acc = grad[j] + GAMMA * before[j]
            if not torch.isfinite(acc).all() or (call, rank) in NAN:
                continue
            # the identity on this rank's own state: sent (acc where the residual was emptied) + new
            # residual = old residual (times gamma) + gradient, and only k entries were emptied
            sent = torch.where(after[j] == 0, acc, torch.zeros_like(acc))
            torch.testing.assert_close(sent + after[j], acc, rtol=1e-6, atol=1e-6)
            assert int((after[j] == 0).sum()) == (0 if (call, rank) in SKIP else ks[j])
    # density 1.0 on the shared path itself (k = n, every index agreed): a dense all-reduce
    full = TopKState(shared_indices=True)
    for call in range(2):
        grad = torch.cat(_grad(call + 10, rank))
        dense = grad.clone()
        dist.all_reduce(dense)
        plan = TopKPlan([True] * 3, list(SIZES), list(SIZES), [False] * 3)
        out = topk_ef_exchange(full, 0, keys, grad, SIZES, plan).wait()
        torch.testing.assert_close(out, dense, rtol=1e-6, atol=1e-6)
    assert full.agreement.rounds == {0: 2, 1: 2, 2: 2}


def test_shared_indices_follow_the_protocol_and_the_ef_identity() -> None:
    """Three ranks: the rotating leader, a bootstrap when k rises, a skipping rank, a NaN rank; the
    sum, each residual, and sent + residual = acc, against the one-process simulation."""
    run_distributed(_exchange_worker, 3, timeout=120)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 32), nn.Linear(32, 4), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.c(torch.tanh(self.a(x)))))


def _setup(rank: int, **fields):
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.002)  # several buckets
    cfg = dict(method="topk_allreduce", dense_fallback=False, base_density=0.1, dense_warmup_steps=2,
               dense_sync_every=5, pipeline_stages=2)
    cfg.update(fields)
    state = CompressedState(**cfg)
    model.register_comm_hook(state, topk_hook)
    return model, state, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _step(model, state, opt, rank: int, step: int, sizes: list[int]) -> None:
    gen = torch.Generator().manual_seed(step)
    x, y = torch.randn(sum(sizes), 8, generator=gen), torch.randn(sum(sizes), 4, generator=gen)
    lo = sum(sizes[:rank])
    state.set_local_batch(sizes[rank], sum(sizes))
    opt.zero_grad()
    nn.functional.mse_loss(model(x[lo:lo + sizes[rank]]), y[lo:lo + sizes[rank]]).backward()
    opt.step()


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _same_on_every_rank(t: torch.Tensor, what: str) -> None:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    for r, other in enumerate(out):
        assert torch.equal(other, t), f"{what}: rank {r} differs"


def _train_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    sizes = [3, 5, 2][:world]
    model, state, opt = _setup(rank)
    trail = []
    for step in range(12):
        _step(model, state, opt, rank, step, sizes)
        _same_on_every_rank(_flat(model), f"parameters after step {step}")
        trail.append(_flat(model).clone())
        if step == 6:
            saved = (copy.deepcopy(model.module.state_dict()), copy.deepcopy(opt.state_dict()), state.state_dict())
    assert state.last_modes and "sparse" in state.last_modes.values(), state.last_modes
    assert 0 < state.density < 0.5
    # resume after step 6 on fresh objects: the same trajectory, to the last step
    model2, state2, opt2 = _setup(rank)
    model2.module.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    state2.load_state_dict(saved[2])
    for step in range(7, 12):
        _step(model2, state2, opt2, rank, step, sizes)
        torch.testing.assert_close(_flat(model2), trail[step], rtol=1e-6, atol=1e-7, msg=f"resumed step {step}")


def test_ddp_training_identical_ranks_and_resume() -> None:
    """DDP with unequal batches (3/5/2), several buckets, two pipeline stages and dense syncs: every
    rank holds the same parameters after every step, and a resume continues the same trajectory."""
    run_distributed(_train_worker, 3, timeout=150)


def _hier_worker(rank: int, world: int) -> None:
    init_gloo(rank, world)
    model, state, opt = _setup(rank, hierarchical=True, fast_groups=[[0, 1], [2, 3]], pipeline_stages="auto")
    for step in range(7):  # step 5 is a dense sync, step 6 sparse again
        _step(model, state, opt, rank, step, [3, 1, 2, 4])
        _same_on_every_rank(_flat(model), f"parameters after step {step}")
    assert "sparse" in state.last_modes.values() or not state.hier.is_leader


def test_hierarchical_dense_inside_groups_shared_between_leaders() -> None:
    """Four ranks in two fast groups: dense inside each group, the shared-index exchange between the
    leaders; every rank holds the same parameters after every step."""
    run_distributed(_hier_worker, 4, timeout=150)
