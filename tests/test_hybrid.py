"""Hybrid local-SGD phases (issue 14) on bare DDP, against independent oracles.

* the phase schedule against hand-built validation losses (different per rank: only their mean decides);
* the averaging path with H = 1 and equal speeds against one-process momentum SGD on the global batch;
* the staleness bound under an injected delay: the weighted average of the sync against its weights,
  and the staleness weights against hand-built cases;
* a checkpoint cut inside a period against the same run uninterrupted.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from hybrid_steps import regression_step
from oracle import make_data, make_net
from torch import nn

from hetero_strategy.config import HeteroConfig, HybridConfig
from hetero_strategy.hybrid import PhaseSchedule, relative_change, staleness_weights

# ---- 1. the phase schedule ------------------------------------------------------------------
# Mean over the two ranks: phase 0 ends at evaluation 2 (|0.97 - 1.0| / 1.0 = 3% < 5%, N = 2),
# phase 1 at evaluation 5 (|0.795 - 0.8| / 0.8 = 0.625% < 1%); phase 2 is synchronous.
MEAN = [1.0, 0.9, 0.97, 0.8, 0.79, 0.795, 0.5, 0.5]
SPREAD = [0.0, 0.3, 0.2, 0.1, 0.4, 0.25, 0.0, 0.0]  # rank 0 gets +, rank 1 gets -: neither alone plateaus


def _schedule(rank: int, world: int) -> dict:
    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    said: list[str] = []
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[8, 2, 1], plateau_thresholds=[0.05, 0.01], plateau_evals=2)
    runtime = HeteroRuntime(cfg, rank, world, info=said.append)
    sign = 1 if rank == 0 else -1
    switched, periods = [], []
    for i, (mean, spread) in enumerate(zip(MEAN, SPREAD, strict=True)):
        if runtime.evaluated(mean + sign * spread):
            switched.append(i)
        periods.append(runtime.hybrid.schedule.period)
    return {"switched": switched, "periods": periods, "said": said, "state": runtime.state_dict()["hybrid"]}


def test_phases_switch_on_the_mean_loss_plateau_at_the_same_evaluation_on_every_rank():
    out = run_distributed(_schedule, 2, timeout=60)
    for rank in range(2):
        assert out[rank]["switched"] == [2, 5]
        assert out[rank]["periods"] == [8, 8, 2, 2, 2, 1, 1, 1]
        assert out[rank]["state"]["schedule"]["phase"] == 2
    assert len(out[0]["said"]) == 2 and out[1]["said"] == []  # logged once, by rank 0
    assert "phase 0 -> 1: sync period 8 -> 2" in out[0]["said"][0]
    assert "phase 1 -> 2: sync period 2 -> 1" in out[0]["said"][1]


def test_relative_change_rule_and_history_reset():
    assert relative_change(0.97, 1.0) == pytest.approx(0.03)
    assert relative_change(0.0, 0.0) == 0.0 and relative_change(1.0, 0.0) == math.inf
    schedule = PhaseSchedule(HybridConfig(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.1], plateau_evals=1),
                             info=lambda m: None, reduce=lambda x: x)
    # a tiny change right at the first evaluation decides nothing: N + 1 = 2 evaluations are needed
    assert not schedule.evaluated(1.0) and schedule.evaluated(0.95) and schedule.period == 1
    assert not schedule.evaluated(0.95)  # the synchronous phase never ends
    schedule.load_state_dict({"phase": 0, "history": [2.0]})
    assert not schedule.evaluated(1.0) and schedule.phase == 0  # 50% change: no plateau


# ---- 2. H = 1 through the averaging path equals synchronous SGD --------------------------------
LR, MOMENTUM, STEPS, SWITCH_AFTER = 0.05, 0.9, 8, 4


def _oracle_momentum(global_batch: int, steps: int) -> nn.Module:
    """One process, batch G in order, SGD with momentum: what 2 ranks must reproduce."""
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = make_data(64).tensors
    for s in range(steps):
        idx = slice(s * global_batch, (s + 1) * global_batch)
        opt.zero_grad()
        nn.functional.mse_loss(net(x[idx]).squeeze(1), y[idx]).backward()
        opt.step()
    return net


def _h1(rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[1, 1], plateau_thresholds=[0.5], plateau_evals=1,
                                 local_clip_norm=None, batch_sizes=[3, 5])
    runtime = HeteroRuntime(cfg, rank, world)
    loader = runtime.train_loader(DataLoader(make_data(64), batch_size=4, shuffle=False), seed=0)
    net = make_net()
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    weights, local = [], []
    for step, (x, y) in enumerate(loader):
        runtime.batch_start()
        local.append(runtime.hybrid.local)
        with runtime.local_step(ddp):
            nn.functional.mse_loss(ddp(x).squeeze(1), y).backward()
        runtime.before_optimizer_step(opt)
        opt.step()
        opt.zero_grad()
        runtime.step_end()
        assert runtime.synced
        if runtime.hybrid.local:
            weights.append(runtime.hybrid.controller.last["weights"])
        if step + 1 == SWITCH_AFTER:  # a flat loss: the synchronous phase from here on
            runtime.evaluated(1.0)
            runtime.evaluated(1.0)
        if step + 1 == STEPS:
            break
    return {"weights": [p.detach().clone() for p in net.parameters()], "averaged": weights, "local": local}


def test_h1_averaging_then_synchronous_phase_equals_one_process_momentum_sgd():
    out = run_distributed(_h1, 2, timeout=60)
    assert out[0]["local"] == [True] * SWITCH_AFTER + [False] * (STEPS - SWITCH_AFTER)
    # samples x 0.9^0: the weights are the batch shares 3/8 and 5/8
    assert out[0]["averaged"] == [pytest.approx([3 / 8, 5 / 8])] * SWITCH_AFTER
    oracle = _oracle_momentum(8, STEPS)
    for rank in range(2):
        for got, want in zip(out[rank]["weights"], oracle.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


# ---- 3. the staleness bound, under a slow rank ---------------------------------------------
TAU, SYNCS, SLEEP_S, BATCH = 3, 4, 0.05, (4, 2)


def _stale(rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[8, 1], plateau_thresholds=[0.05], max_staleness=TAU)
    runtime = HeteroRuntime(cfg, rank, world)
    torch.manual_seed(0)
    # BatchNorm: its running statistics are averaged too, and DDP's buffer broadcast must not
    # run per local step (unequal step counts would hang in it)
    net = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)

    def tensors() -> list[torch.Tensor]:  # parameters and floating buffers
        return [t.detach().clone() for t in net.state_dict().values() if t.is_floating_point()]

    syncs = [{"after": tensors()}]  # the first anchor
    while runtime.checkpoint_step() < SYNCS:
        x = torch.randn(BATCH[rank], 5, generator=g)
        regression_step(runtime, ddp, opt, x)
        if rank == 1:
            time.sleep(SLEEP_S)  # the slow device
        before = tensors()
        runtime.step_end(samples=BATCH[rank])
        if runtime.synced:
            syncs.append({"before": before, "after": tensors(), **runtime.hybrid.controller.last})
    return {"syncs": syncs, "steps": runtime.steps}


# Hand-built cases of w_r = samples_r x decay^(lead - steps_r), normalised (lead = the most steps):
# * steps 8, 5; samples 32, 10; decay 0.9: 32 x 0.9^0 = 32 and 10 x 0.9^3 = 7.29, total 39.29
#   -> 32 / 39.29 = 0.814457, 7.29 / 39.29 = 0.185543
# * equal steps 4, 4; samples 3, 5: no discount -> the sample shares 3/8, 5/8
# * steps 6, 6, 4; samples 12, 6, 8; decay 0.5: 12, 6, 8 x 0.25 = 2, total 20 -> 0.6, 0.3, 0.1
# * decay 1.0 (no discount): steps 8, 2; samples 1, 3 -> 1/4, 3/4
# * a rank without samples weighs 0: steps 5, 0; samples 4, 0 -> 1, 0; nobody has samples -> 0, 0
STALENESS_CASES = [
    ([8, 5], [32, 10], 0.9, [0.814457, 0.185543]),
    ([4, 4], [3, 5], 0.9, [0.375, 0.625]),
    ([6, 6, 4], [12, 6, 8], 0.5, [0.6, 0.3, 0.1]),
    ([8, 2], [1, 3], 1.0, [0.25, 0.75]),
    ([5, 0], [4, 0], 0.9, [1.0, 0.0]),
    ([3, 1], [0, 0], 0.9, [0.0, 0.0]),
]


@pytest.mark.parametrize(("steps", "samples", "decay", "want"), STALENESS_CASES)
def test_staleness_weights_against_hand_cases(steps, samples, decay, want):
    assert staleness_weights(steps, samples, decay) == pytest.approx(want, rel=1e-5, abs=1e-12)


def test_the_staleness_bound_forces_syncs_and_the_late_rank_still_counts():
    out = run_distributed(_stale, 2, timeout=60)
    assert out[0]["steps"] > out[1]["steps"]  # the fast rank is not held to the slow rank's count
    for i in range(1, SYNCS + 1):
        s0, s1 = out[0]["syncs"][i], out[1]["syncs"][i]
        steps = s0["steps"]
        assert steps == s1["steps"] and min(steps) >= 1 and max(steps) <= 8
        assert max(steps) - min(steps) <= TAU, steps
        assert s0["samples"] == [BATCH[r] * steps[r] for r in range(2)]
        # the weights the sync used: staleness_weights (pinned by the hand cases below) of these
        # counts, summing to 1; a late rank weighs less than its sample share, an on-time one exactly it
        w = s0["weights"]
        assert w == s1["weights"] == staleness_weights(steps, s0["samples"], 0.9)
        assert sum(w) == pytest.approx(1.0)
        share = s0["samples"][1] / sum(s0["samples"])
        assert w[1] < share if steps[1] < steps[0] else w[1] == pytest.approx(share), (steps, w)
        anchor = out[0]["syncs"][i - 1]["after"]
        for k, a in enumerate(anchor):
            want = a.double() + sum(w[r] * (out[r]["syncs"][i]["before"][k].double() - a.double()) for r in range(2))
            torch.testing.assert_close(s0["after"][k].double(), want, rtol=0, atol=1e-6)
            assert torch.equal(s0["after"][k], s1["after"][k])  # one model on every rank after the sync
    assert any(max(s["steps"]) < 8 for s in out[0]["syncs"][1:])  # forced before the leader reached H
    gaps = [max(s["steps"]) - min(s["steps"]) for s in out[0]["syncs"][1:]]
    assert max(gaps) >= 1  # the delay made rank 1 late: its contribution was weighted, not dropped
    assert all(0 < s["weights"][1] < 1 for s in out[0]["syncs"][1:])


# ---- 4. a checkpoint cut inside a period resumes to the uninterrupted run --------------------
# H = 4: syncs after steps 4 and 8; the cut after step 6 falls inside the second period. The
# hand-made validation losses (one per sync) then switch to H = 2 at sync 2 and to synchronous
# DDP at sync 4, both after the cut, so the resumed schedule must carry its history.
TOTAL, CUT = 14, 6
VAL = {1: 1.0, 2: 0.7, 3: 0.69, 4: 0.689}


def _ckpt(rank: int, world: int, directory: str, resume: bool) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.runtime import HeteroRuntime
    from hetero_strategy.runtime.checkpoint import Checkpointer

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[4, 2, 1], plateau_thresholds=[0.5, 0.1], plateau_evals=1)
    runtime = HeteroRuntime(cfg, rank, world)
    net = make_net()
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    ckpt = Checkpointer(runtime, directory, every_steps=10**6, every_s=10**9)
    out: dict = {}
    if resume:
        assert ckpt.resume(ddp, opt) is not None
        out["loaded"] = [p.detach().clone() for p in net.parameters()]
    for step in range(runtime.steps, TOTAL):
        g = torch.Generator().manual_seed(100 * rank + step)
        x = torch.randn(3 + rank, 5, generator=g)  # unequal batches: unequal weights
        with runtime.local_step(ddp):
            nn.functional.mse_loss(ddp(x).squeeze(1), 2 * x.sum(1)).backward()
        runtime.before_optimizer_step(opt)
        opt.step()
        opt.zero_grad()
        runtime.step_end(samples=len(x))
        if runtime.synced and runtime.hybrid.local:
            runtime.evaluated(VAL[runtime.checkpoint_step()])
        if not resume and runtime.steps == CUT:
            ckpt.save(ddp, opt)
            ckpt.wait()
            out["anchor"] = [t.clone() for t in runtime.hybrid.controller.anchor.values()]
            out["local"] = [p.detach().clone() for p in net.parameters()]
        dist.barrier()  # equal speeds made exact: the same step counts in every run
    ckpt.close()
    return {**out, "final": [p.detach().clone() for p in net.parameters()], "syncs": runtime.checkpoint_step(),
            "phase": runtime.hybrid.schedule.phase, "switches": runtime.hybrid.schedule.switches}


def test_a_checkpoint_inside_a_period_resumes_to_the_uninterrupted_run(tmp_path):
    full = run_distributed(_ckpt, 2, str(tmp_path), False, timeout=90)
    resumed = run_distributed(_ckpt, 2, str(tmp_path), True, timeout=90)
    for rank in range(2):
        # the cut is mid-period: the rank's own model differs from the anchor every rank saved
        assert any(not torch.equal(a, b) for a, b in zip(full[rank]["anchor"], full[rank]["local"], strict=True))
        for got, want in zip(resumed[rank]["loaded"], full[0]["anchor"], strict=True):
            assert torch.equal(got, want)  # the checkpoint's model is the anchor, the same on every rank
        for got, want in zip(resumed[rank]["final"], full[rank]["final"], strict=True):
            assert torch.equal(got, want), (rank, (got - want).abs().max())
        assert resumed[rank]["phase"] == full[rank]["phase"] == 2 and resumed[rank]["syncs"] == full[rank]["syncs"]
        assert [s["phase"] for s in resumed[rank]["switches"]] == [1, 2]
    assert [p for p in tmp_path.iterdir()] == [tmp_path / "step_00000001"]  # named by sync points
    # another world size: the phase, its history and the sync count carry over, the model is the anchor
    other = run_distributed(_other_world, 1, str(tmp_path), timeout=60)[0]
    assert other["schedule"] == {"phase": 0, "history": [1.0], "switches": []} and other["syncs"] == 1
    for got, want in zip(other["loaded"], full[0]["anchor"], strict=True):
        assert torch.equal(got, want)


def _other_world(rank: int, world: int, directory: str) -> dict:
    from hetero_strategy.runtime import HeteroRuntime
    from hetero_strategy.runtime.checkpoint import Checkpointer

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[4, 2, 1], plateau_thresholds=[0.5, 0.1], plateau_evals=1)
    runtime = HeteroRuntime(cfg, rank, world)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    resumed = Checkpointer(runtime, directory, every_steps=10**6, every_s=10**9).resume(net, opt)
    assert resumed is not None and resumed.world_size_saved == 2
    runtime.register_hook(torch.nn.parallel.DistributedDataParallel(net))
    return {"schedule": runtime.hybrid.schedule.state_dict(), "syncs": runtime.checkpoint_step(),
            "loaded": [p.detach().clone() for p in net.parameters()]}


# ---- the end of the data: join --------------------------------------------------------------
EPOCH_BATCHES = 6


def _recording(controller) -> list[dict]:
    """Every sync's counts, including those inside join() (a wrapper, no change to the logic)."""
    records: list[dict] = []
    original = controller.sync

    def sync(joined: bool = False) -> bool:
        done = original(joined)
        records.append(dict(controller.last, joined=sorted(controller.joined), all_joined=done))
        return done

    controller.sync = sync
    return records


def _epochs(rank: int, world: int, directory: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.runtime import HeteroRuntime
    from hetero_strategy.runtime.checkpoint import Checkpointer

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[8, 1], plateau_thresholds=[0.05], max_staleness=TAU)
    runtime = HeteroRuntime(cfg, rank, world)
    net = make_net()
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp)
    records = _recording(runtime.hybrid.controller)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    # time-based saves: rank 0's clock decides a few sync points ahead; the syncs inside join()
    # (which only the active ranks see) must not throw the ranks' counts apart
    ckpt = Checkpointer(runtime, directory, every_s=0.01)
    saved = []
    g = torch.Generator().manual_seed(rank)
    evaluated = []
    for _epoch in range(2):
        for _ in range(EPOCH_BATCHES):  # the same number of batches per rank, rank 1 slower
            x = torch.randn(BATCH[rank], 5, generator=g)
            regression_step(runtime, ddp, opt, x)
            if rank == 1:
                time.sleep(0.02)
            runtime.step_end(samples=BATCH[rank])
            if ckpt.step_end(ddp, opt):
                saved.append(runtime.checkpoint_step())
        runtime.join()
        assert runtime.synced
        if ckpt.step_end(ddp, opt):
            saved.append(runtime.checkpoint_step())
        evaluated.append(runtime.evaluated(1.0))  # a collective every rank reaches after join
    ckpt.close()
    return {"records": records, "final": [p.detach().clone() for p in net.parameters()], "saved": saved}


def test_join_at_the_end_of_the_data_keeps_every_sample_and_ends_on_one_model(tmp_path):
    out = run_distributed(_epochs, 2, str(tmp_path), timeout=60)
    records = out[0]["records"]
    assert [(r["steps"], r["samples"]) for r in records] == [(r["steps"], r["samples"]) for r in out[1]["records"]]
    for rank in range(2):  # nothing dropped: every rank's samples of both epochs are in some sync
        assert sum(r["samples"][rank] for r in records) == 2 * EPOCH_BATCHES * BATCH[rank]
    assert sum(r["all_joined"] for r in records) == 2  # one final sync per epoch
    assert any(r["joined"] == [0] for r in records)  # rank 0 ran out first and waited in join()
    for r in records:
        assert all(w == 0 for w, s in zip(r["weights"], r["steps"], strict=True) if s == 0)  # no steps: no weight
    for a, b in zip(out[0]["final"], out[1]["final"], strict=True):
        assert torch.equal(a, b)
    assert out[0]["saved"] == out[1]["saved"] and out[0]["saved"]  # the same sync points on every rank


def _frozen_peer(rank: int, world: int) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[8, 1], plateau_thresholds=[0.05], stall_timeout_s=1)
    runtime = HeteroRuntime(cfg, rank, world)
    ddp = DistributedDataParallel(make_net())
    runtime.register_hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for _ in range(2 if rank == 0 else 100):
        with runtime.local_step(ddp):
            ddp(torch.ones(2, 5)).sum().backward()
        runtime.before_optimizer_step(opt)
        opt.step()
        opt.zero_grad()
        runtime.step_end()
        if runtime.hybrid.controller.joined:  # rank 1 learned that rank 0 joined: now it freezes
            time.sleep(3)
            return
    runtime.join()


def test_a_frozen_peer_stops_join_with_a_clear_error():
    with pytest.raises(RuntimeError, match=r"rank 0 failed:(.|\n)*StallError: hetero: rank 0 joined .* waited more "
                       r"than stall_timeout_s=1 s for rank\(s\) \[1\]"):
        run_distributed(_frozen_peer, 2, timeout=60)


# ---- one process: clipping, the period, metrics ---------------------------------------------
def test_local_steps_clip_count_to_h_and_report_without_a_collective():
    from hetero_strategy.hybrid import HybridTraining

    net = nn.Linear(4, 1)
    hybrid = HybridTraining(HybridConfig(mode="hybrid", periods=[3, 1], plateau_thresholds=[0.5], plateau_evals=1),
                            rank=0, world_size=1, info=lambda m: None)
    hybrid.attach(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    synced = []
    for _ in range(6):
        with hybrid.local_step(net):
            (100 * net(torch.ones(2, 4))).sum().backward()
        hybrid.before_optimizer_step(opt)
        norm = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).norm()
        assert norm == pytest.approx(5.0)  # local_clip_norm's default
        opt.step()
        opt.zero_grad()
        synced.append(hybrid.step_end(samples=2))
    assert synced == [False, False, True] * 2  # H = 3
    assert hybrid.metrics() == {"hybrid/phase": 0, "hybrid/period": 3, "hybrid/syncs": 2, "hybrid/steps_r0": 3,
                                "hybrid/weight_r0": 1.0, "hybrid/delta_bytes_sent": 4 * 5}
    assert not hybrid.evaluated(1.0) and hybrid.evaluated(1.0) and not hybrid.local  # the synchronous phase
    with hybrid.local_step(net):
        (100 * net(torch.ones(2, 4))).sum().backward()
    hybrid.before_optimizer_step(opt)  # no local clipping any more
    assert torch.cat([p.grad.reshape(-1) for p in net.parameters()]).norm() > 5.0


# ---- 5. a diverged rank, and Adam's state at the switch to synchronous ------------------------
def _diverged_then_adam(rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[2, 1], plateau_thresholds=[0.5], plateau_evals=1,
                                 local_clip_norm=None)
    runtime = HeteroRuntime(cfg, rank, world)
    torch.manual_seed(0)
    net = nn.Linear(5, 1)
    ddp = DistributedDataParallel(net)
    runtime.register_hook(ddp)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    x = torch.randn(4 + 4 * rank, 5, generator=torch.Generator().manual_seed(rank))  # 4 and 8 samples
    out: dict = {"weights": [], "states": []}
    for period in range(2):
        for _ in range(2):
            regression_step(runtime, ddp, opt, x)
            if period == 0 and rank == 1 and runtime.hybrid.controller.count == 1:
                with torch.no_grad():
                    net.weight.fill_(float("nan"))  # rank 1 diverges inside the first period
            torch.distributed.barrier()  # lockstep: each rank ends the period after exactly 2 steps
            runtime.step_end(samples=len(x))
        out["weights"].append(runtime.hybrid.controller.last["weights"])
        out.setdefault("after", []).append([p.detach().clone() for p in net.parameters()])
    out["states"] = [{k: v.clone() for k, v in opt.state[p].items()} for p in net.parameters()]
    runtime.evaluated(1.0)
    runtime.evaluated(1.0)  # a flat loss: the synchronous phase; Adam's state is averaged
    out["switched"] = [{k: v.clone() for k, v in opt.state[p].items()} for p in net.parameters()]
    return out


def test_a_diverged_rank_is_left_out_and_adam_state_is_averaged_by_samples_at_the_switch():
    out = run_distributed(_diverged_then_adam, 2, timeout=60)
    assert out[0]["weights"][0] == [1.0, 0.0]  # rank 1's NaN period weighs nothing
    for rank in range(2):
        assert all(torch.isfinite(p).all() for p in out[rank]["after"][0])
        for got, want in zip(out[rank]["after"][0], out[0]["after"][0], strict=True):
            assert torch.equal(got, want)  # one model, rank 0's: the average of the finite ranks
    # the second period: both finite, weights by samples 4 : 8
    assert out[0]["weights"][1] == pytest.approx([1 / 3, 2 / 3])
    # at the switch: each rank's share of the phase's samples weighs its Adam moments (rank 0: 2
    # periods of 2 x 4; rank 1: 2 x 8 in the finite period only), not the last sync's 1/3 : 2/3;
    # the step counters take the max
    shares = [16 / 32, 16 / 32]
    for k in range(2):
        for name in ("exp_avg", "exp_avg_sq"):
            want = sum(shares[r] * out[r]["states"][k][name].double() for r in range(2))
            for rank in range(2):
                torch.testing.assert_close(out[rank]["switched"][k][name].double(), want, rtol=1e-6, atol=1e-9)
        assert float(out[0]["switched"][k]["step"]) == 4.0 == float(out[1]["switched"][k]["step"])
