"""The probe's noise: windows of enough steps, their spread, and an even split when ranks agree within it.

Oracles: hand-built step costs with hand-computed splits (a rank at 0.57 of another's speed gets
64 x 1 / 1.57 = 40.8 of 64 samples), hand-counted calls, and quartiles computed by hand.
"""

from __future__ import annotations

import types

import pytest

from hetero_strategy.balance.probe import StepCost
from hetero_strategy.balance.timing import equal_within_noise, measure_steps, relative_spread
from hetero_strategy.config import BalanceConfig
from hetero_strategy.runtime import planner


def _plan(monkeypatch, costs: list[StepCost], global_batch: int = 64) -> tuple[list[int], list[str]]:
    """plan_batch_sizes as every rank runs it, with the all-gathered costs replaced by ``costs``."""
    monkeypatch.setattr(planner, "gather_step_costs", lambda cost, world, info, warn: costs)
    said: list[str] = []
    sizes = planner.plan_batch_sizes(BalanceConfig(), len(costs), global_batch, lambda: costs[0], said.append)
    return sizes, said


def test_ranks_equal_within_their_noise_split_evenly(monkeypatch):
    # 32 samples take 0.320 ms ± 10% and 0.376 ms ± 8%: the bands [0.288, 0.352] and [0.346, 0.406]
    # overlap, so the 15% gap is noise. The timed split would give [35, 29].
    sizes, said = _plan(monkeypatch, [StepCost(100_000.0, spread=0.10), StepCost(85_000.0, spread=0.08)])
    assert sizes == [32, 32]
    assert said == ["hetero: probed at 32 samples per rank: 100.0k ± 10% vs 85.0k ± 8% samples/s → treated as equal"]
    # the same with four ranks, one of them the slowest by 12% but the noisiest
    four = [StepCost(100.0, spread=0.05), StepCost(98.0, spread=0.04), StepCost(89.0, spread=0.09),
            StepCost(101.0, spread=0.04)]
    assert _plan(monkeypatch, four)[0] == [16, 16, 16, 16]


def test_clearly_different_ranks_split_by_speed(monkeypatch):
    # 1.0 vs 0.57 of its speed, each known to 5%: 64 / 1.57 = 40.76 -> [41, 23].
    sizes, said = _plan(monkeypatch, [StepCost(100.0, spread=0.05), StepCost(57.0, spread=0.05)])
    assert sizes == [41, 23]
    assert said[-1].endswith("100.0 ± 5% vs 57.0 ± 5% samples/s → split by speed")
    # a 10% gap measured to 1% (bands at least ±3% wide) is real: 64 x 100/190 = 33.7 -> [34, 30]
    assert _plan(monkeypatch, [StepCost(100.0, spread=0.01), StepCost(90.0, spread=0.01)])[0] == [34, 30]
    # fixed costs count: at 32 samples 0.32 s vs 0.52 s (the second pays 0.2 s per step), far apart;
    # equal step times 0.2 + b/100 ... : b0/100 = 0.2 + b1/100, b0 + b1 = 64 -> [42, 22]
    assert _plan(monkeypatch, [StepCost(100.0, spread=0.02), StepCost(100.0, 0.2, spread=0.02)])[0] == [42, 22]


def test_the_rule_by_hand():
    assert equal_within_noise([1.0, 1.05], [0.02, 0.04])       # 1.008 <= 1.02
    assert not equal_within_noise([1.0, 1.10], [0.02, 0.04])   # 1.056 > 1.03 (floor 3% on the first)
    assert equal_within_noise([1.0, 1.05], [0.0, 0.0])         # the 3% floor on both: 1.0185 <= 1.03
    assert equal_within_noise([1.0, 1.75], [0.3, 0.3])         # 30% noise hides even 1.75x: 1.225 <= 1.3
    assert not equal_within_noise([1.0, 1.9], [0.3, 0.3])      # 1.33 > 1.3
    assert equal_within_noise([1.0], [0.0])


def test_spread_is_half_the_interquartile_range_over_the_median():
    # sorted [1, 2, 3, 4, 10]: quartiles 2 and 4, median 3 -> (4 - 2) / 2 / 3
    assert relative_spread([10.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(1 / 3)
    assert relative_spread([5.0]) == 0.0


def test_windows_hold_enough_steps_and_noise_buys_more_rounds(monkeypatch):
    from hetero_strategy.balance import timing

    clock = [0.0]  # a fake clock the steps advance: no sleeping, nothing left to the machine's load
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    calls = []

    def step(start_comm) -> None:  # 1 ms, then 3 ms, alternately: every other window is slow
        calls.append(None)
        clock[0] += 0.001 if len(calls) % 2 else 0.003

    quiet = measure_steps([step], steps=3, warmup=1)
    assert len(calls) == 1 + 3 and len(quiet) == 1  # one step per window, steps rounds: the old count
    calls.clear()
    noisy = measure_steps([step], steps=3, warmup=1, target_spread=0.05)
    assert len(calls) == 1 + 3 * 3  # windows of 3, 1, 3, ... ms: a large spread, up to 3 x steps rounds
    assert noisy[0].spread == pytest.approx(1 / 3)  # sorted 1,1,1,1,3,3,3,3,3: quartiles 1 and 3, median 3
    calls.clear()
    measure_steps([step], steps=3, warmup=1, target_spread=0.05, max_seconds=0.0075)
    assert len(calls) == 1 + 4  # 3 + 1 + 3 ms after 3 rounds, 8 ms after the 4th: the time bound ends it
    calls.clear()
    # windows of at least 20 ms: the warm-up step took 1 ms, so 20 steps a window, 10 of each
    (timed,) = measure_steps([step], steps=3, warmup=1, min_seconds=0.02, target_spread=0.05)
    assert len(calls) == 1 + 3 * 20
    assert timed.seconds == pytest.approx(0.002) and timed.spread == pytest.approx(0.0, abs=1e-9)


def _arrive(rank: int, world: int) -> tuple[int, float]:
    import time

    from dist_utils import init_gloo

    from hetero_strategy.balance.timing import busy_until_all_arrive

    init_gloo(rank, world)
    if rank == 1:
        time.sleep(0.5)  # rank 1's timed work lasts half a second longer
    started = time.monotonic()
    count = busy_until_all_arrive(lambda: time.sleep(0.01))
    return count, time.monotonic() - started


def test_a_rank_done_early_keeps_stepping_until_the_last_arrives():
    from dist_utils import run_distributed

    from hetero_strategy.balance.timing import busy_until_all_arrive

    (early, waited), (late, _) = run_distributed(_arrive, 2, timeout=60)
    assert waited >= 0.4 and early >= 20  # rank 0 stepped (10 ms a step) through rank 1's extra 0.5 s
    assert late <= 3  # rank 1 arrived last: it is let go at once
    assert busy_until_all_arrive(lambda: 1 / 0) == 0  # no process group: no step runs
