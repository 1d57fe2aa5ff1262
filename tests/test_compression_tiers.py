"""Every mix of link tiers, flat on 2 gloo ranks and hierarchical on 4, equals a hand-written EF simulation.

Bare DDP, ``compression="tiered"``, batch sizes [3, 13] (or four ranks' slices), 7 SGD steps that
cover the dense warm-up, compressed steps, skipped exchanges (eth10g every 2nd, eth1g every 5th
step) and a periodic dense sync. The oracle is :mod:`ef_oracle`, one process in plain torch.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from ef_oracle import OVERRIDES, TieredEF
from oracle import make_data, make_net
from torch import nn

TIERS = ["nvlink", "ib", "eth10g", "eth1g"]
PAIRS = list(itertools.product(TIERS, TIERS))
STEPS = 7
CFG = dict(base=0.5, floor=0.01, warmup=1, period=6, sync_every=5)
HIER_TIERS = ["nvlink", "nvlink", "eth1g", "eth1g"]


TRITON_PAIRS = [("ib", "eth10g"), ("nvlink", "eth1g"), ("eth1g", "eth1g")]


def _config(tiers: list[str], hierarchical: bool, backend: str = "torch"):
    from hetero_strategy.config import CompressionConfig

    return CompressionConfig(method="tiered", tiers=tiers, dense_fallback=False, base_density=CFG["base"],
                             min_density=CFG["floor"], dense_warmup_steps=CFG["warmup"], density_period=CFG["period"],
                             dense_sync_every=CFG["sync_every"], hierarchical=hierarchical, tier_overrides=OVERRIDES,
                             fast_groups=[[0, 1], [2, 3]] if hierarchical else None, compression_backend=backend)


def _train(rank: int, world: int, runs: list[tuple], sizes: list[int]) -> list[dict]:
    import os

    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.hooks import CompressedState, topk_hook

    os.environ["TRITON_INTERPRET"] = "1"  # the Triton kernels run on CPU tensors only under the interpreter
    init_gloo(rank, world)
    x, y = make_data(sum(sizes) * STEPS).tensors
    start, g = sum(sizes[:rank]), sum(sizes)
    out = []
    for tiers, hierarchical, *extra in runs:
        backend, cost = (extra[0] if extra else "torch"), (extra[1] if len(extra) > 1 else None)
        ddp = DistributedDataParallel(make_net())
        state = CompressedState(_config(tiers, hierarchical, backend))
        state.cost = cost  # a hand-built link/codec measurement (dense_fallback), or None
        state.set_local_batch(sizes[rank], g)
        ddp.register_comm_hook(state, topk_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        stats = []
        for s in range(STEPS):
            idx = slice(s * g + start, s * g + start + sizes[rank])
            nn.functional.mse_loss(ddp(x[idx]).squeeze(1), y[idx]).backward()
            opt.step()
            opt.zero_grad()
            stats.append((state.density, state.last_bytes_sent, state.dense_fallback))
        out.append({"weights": [p.detach().clone() for p in ddp.parameters()], "stats": stats})
    return out


def _oracle(members: list[str], sizes: list[int], groups: list[list[int]], whole=None):
    """One process: per-rank gradients of their slices, weighted, summed per member, then TieredEF."""
    net = make_net()
    x, y = make_data(sum(sizes) * STEPS).tensors
    sim, g = TieredEF(members, CFG, whole), sum(sizes)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for s in range(STEPS):
        per_rank = []
        for r, b in enumerate(sizes):
            start = s * g + sum(sizes[:r])
            net.zero_grad()
            nn.functional.mse_loss(net(x[start:start + b]).squeeze(1), y[start:start + b]).backward()
            per_rank.append([p.grad * (b / g) for p in net.parameters()])
        grads = [[sum(per_rank[r][p] for r in grp) for p in range(len(per_rank[0]))] for grp in groups]
        reduced = sim.reduce(s, grads)
        for p, total in zip(net.parameters(), reduced):
            p.grad = total
        opt.step()
    return net, sim


@pytest.fixture(scope="module")
def flat():
    return run_distributed(_train, 2, [(list(p), False) for p in PAIRS], [3, 13], timeout=240)


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_every_tier_pair_equals_the_simulation(flat, pair):
    net, sim = _oracle(list(pair), [3, 13], [[0], [1]])
    got = flat[0][PAIRS.index(pair)]["weights"]
    for a, b in zip(got, flat[1][PAIRS.index(pair)]["weights"]):
        assert torch.equal(a, b), "ranks disagree"
    for a, want in zip(got, net.parameters()):
        torch.testing.assert_close(a, want.detach(), rtol=1e-5, atol=1e-6)
    if "nvlink" not in pair:  # something really was compressed: the test is not dense-only
        assert any(r.abs().sum() > 0 for res in sim.residuals for r in res.values())


def test_density_and_bytes_match_a_hand_count(flat):
    # (ib, ib), step 1: density 0.5 x 0.5 = 0.25; parameters of 40, 8, 8 and 1 entries -> k = 10, 2, 2, 1.
    # The first three go sparse (2 ranks x cap < n): one all-gather of 14 values + 14 indices + the
    # marker = 29 x 4 B, and (W - 1) = 1 copy of it is sent; the 1-entry bias goes dense: an all-reduce
    # of 4 B, 2 (W - 1) / W x 4 = 4 B sent. Entries sent: 10 + 2 + 2 + 1 = 15 of 57.
    density, sent, _ = flat[0][PAIRS.index(("ib", "ib"))]["stats"][1]
    assert sent == 29 * 4 + 4 and density == pytest.approx(15 / 57)
    # (nvlink, eth1g), step 1: the dense tier makes every parameter dense for both ranks, so both
    # send all 57 entries (+ the marker) in one all-reduce: 2 (W - 1) / W x 58 x 4 B.
    for rank in range(2):
        density, sent, _ = flat[rank][PAIRS.index(("nvlink", "eth1g"))]["stats"][1]
        assert density == 1.0 and sent == 58 * 4


def test_hooks_through_the_triton_kernels_equal_the_torch_path(flat):
    # selection, compaction, error feedback and scatter run as Triton kernels (interpreted on CPU)
    out = run_distributed(_train, 2, [(list(p), False, "triton") for p in TRITON_PAIRS], [3, 13], timeout=240)
    for i, pair in enumerate(TRITON_PAIRS):
        for rank in range(2):
            for a, b in zip(out[rank][i]["weights"], flat[rank][PAIRS.index(pair)]["weights"]):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            assert out[rank][i]["stats"] == flat[rank][PAIRS.index(pair)]["stats"]


def test_hierarchical_nvlink_nodes_on_a_slow_link_equal_the_simulation():
    # Groups [0, 1] and [2, 3] reduce densely inside; the leaders exchange over the job's slowest
    # link: both take eth1g (group [0, 1] is all NVLink, so it reaches group [2, 3] over eth1g).
    sizes = [3, 5, 2, 6]
    out = run_distributed(_train, 4, [(HIER_TIERS, True)], sizes, timeout=240)
    net, sim = _oracle(["eth1g", "eth1g"], sizes, [[0, 1], [2, 3]])
    for rank in range(4):
        for a, want in zip(out[rank][0]["weights"], net.parameters()):
            torch.testing.assert_close(a, want.detach(), rtol=1e-5, atol=1e-6)
    assert any(r.abs().sum() > 0 for res in sim.residuals for r in res.values())


def test_parameters_that_do_not_pay_go_whole_and_the_rest_equal_the_simulation():
    # Hand-built measurement: dense costs 1 s per entry (4 B at 4 B/s); the codec 0.5 s per entry;
    # an all-gather of cap entries from 2 ranks 2 x cap s. Top-K pays iff 0.5 n + 2 cap < n, i.e.
    # cap < n / 4. Tiers (ib, eth1g): cap follows ib's density 0.5 x 0.5 x cosine (period 6):
    # step 1: 0.25 -> caps 10, 2, 2, 1 for n = 40, 8, 8, 1: nothing pays (the plain all-reduce);
    # step 2: 0.233 -> 10, 2, 2, 1: nothing; step 3: 0.1875 -> 8, 2, 2, 1: the 40-entry weight pays;
    # step 4: 0.125 -> 5, 1, 1, 1: all but the 1-entry bias; step 5: the periodic dense sync;
    # step 6: 0.0167 -> 1, 1, 1, 1: all but the bias.
    from hetero_strategy.hooks.cost import CompressionCost

    cost = CompressionCost(link_bytes_per_s=4.0, codec_s_per_entry=0.5)
    whole = {1: {0, 1, 2, 3}, 2: {0, 1, 2, 3}, 3: {1, 2, 3}, 4: {3}, 6: {3}}
    out = run_distributed(_train, 2, [(["ib", "eth1g"], False, "torch", cost)], [3, 13], timeout=240)
    net, sim = _oracle(["ib", "eth1g"], [3, 13], [[0], [1]], whole)
    for rank in range(2):
        for a, want in zip(out[rank][0]["weights"], net.parameters()):
            torch.testing.assert_close(a, want.detach(), rtol=1e-5, atol=1e-6)
    assert any(r.abs().sum() > 0 for res in sim.residuals for r in res.values())  # something was sparse
    stats = out[0][0]["stats"]
    # step 1: 57 entries whole, a plain all-reduce of 57 x 4 B (no marker): 2 (W - 1) / W x 228 B
    assert stats[1] == (1.0, 57 * 4, 1.0)
    assert stats[3][2] == pytest.approx(17 / 57) and stats[4][2] == pytest.approx(1 / 57)
    assert stats[5][2] == 0.0  # the dense sync is not a fallback
