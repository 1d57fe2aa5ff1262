"""Online calibrator (docs/design.md semantics 5) against hand-built cases and injected timings."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from dist_utils import init_gloo, run_distributed

from hetero_strategy.balance.calibrator import Calibrator
from hetero_strategy.config import CalibrationConfig


def _cfg(**kw) -> CalibrationConfig:
    base = {"calibrate": True, "cold_start_steps": 10, "recalibrate_every": 20, "window": 20, "max_change": 0.15}
    base.update(kw)
    return CalibrationConfig(**base)


def _timings(sizes, speeds, rng, noise):
    """The oracle of a rank's compute time: b_r / speed_r, with multiplicative seeded noise."""
    return [b / s * (1.0 + noise * rng.gauss(0.0, 1.0)) for b, s in zip(sizes, speeds)]


def _drive(cal, speeds, steps, seed=0, noise=0.03):
    rng = random.Random(seed)
    history = [list(cal.sizes)]
    for step in range(steps):
        new = cal.observe(step, _timings(cal.sizes, speeds, rng, noise), cal.sizes)
        if new is not None:
            history.append(new)
    return history


def test_hand_built_move_is_clamped_to_max_change():
    # speeds 100 and 50 samples/s -> target [133.3, 66.7]; +-15% of 100 caps the move at [115, 85].
    cal = Calibrator(_cfg(cold_start_steps=0, recalibrate_every=5), [100, 100])
    decisions = [cal.observe(s, [1.0, 2.0], [100, 100]) for s in range(5)]
    assert decisions[:4] == [None] * 4
    assert decisions[4] == [115, 85]


@pytest.mark.parametrize("speeds", [[1.0, 0.57], [1.0, 0.57, 0.8], [0.3, 1.0, 1.0, 0.5]])
def test_converges_from_equal_shares_to_speed_ratio(speeds):
    n = len(speeds)
    cal = Calibrator(_cfg(), [128] * n)
    history = _drive(cal, speeds, steps=400, seed=n)
    final = history[-1]
    assert sum(final) == 128 * n
    for k in range(1, n):
        ratio = final[0] / final[k]
        assert ratio == pytest.approx(speeds[0] / speeds[k], rel=0.05), (final, speeds)


@pytest.mark.parametrize("seed", range(5))
def test_no_move_exceeds_max_change_and_sum_is_constant(seed):
    rng = random.Random(seed)
    speeds = [rng.uniform(0.05, 1.0) for _ in range(4)]
    cal = Calibrator(_cfg(max_change=0.15), [64] * 4)
    history = _drive(cal, speeds, steps=300, seed=seed, noise=0.1)
    assert len(history) > 2
    for old, new in itertools.pairwise(history):
        assert sum(new) == 256
        for b0, b1 in zip(old, new):
            assert abs(b1 - b0) <= 0.15 * b0 + 1e-9, (old, new)


def test_tiny_batches_keep_two_samples_per_rank_where_the_batch_allows():
    """A 100x faster rank draws the batch, but every other rank keeps 2 samples (a BatchNorm over a
    1x1 map cannot train on one); with fewer than 2 per rank in the global batch, 1 is the floor."""
    cal = Calibrator(_cfg(), [3, 3, 3, 3])
    history = _drive(cal, [1.0, 0.01, 0.01, 0.01], steps=300)
    for sizes in history:
        assert sum(sizes) == 12 and min(sizes) >= 2
    assert history[-1] == [6, 2, 2, 2]
    cal = Calibrator(_cfg(), [2, 2, 2, 1])
    history = _drive(cal, [1.0, 0.01, 0.01, 0.01], steps=300)
    assert all(sum(sizes) == 7 and min(sizes) >= 1 for sizes in history) and history[-1] == [4, 1, 1, 1]


def test_cold_start_and_period():
    cal = Calibrator(_cfg(cold_start_steps=10, recalibrate_every=20), [128, 128])
    rng = random.Random(0)
    steps = []
    for step in range(120):
        if cal.observe(step, _timings(cal.sizes, [1.0, 0.5], rng, 0.0), cal.sizes) is not None:
            steps.append(step)
    # cold start steps 0..9 are ignored; decisions fall on steps 29, 49, 69, ...
    assert steps and all((s - 10 + 1) % 20 == 0 for s in steps)
    assert steps[0] == 29


def test_rows_from_an_old_plan_are_not_used():
    # The strategy applies a decision from a later step; rows still run with the old sizes must
    # not count, and too few rows with the new sizes defer the decision.
    cal = Calibrator(_cfg(cold_start_steps=0, recalibrate_every=5), [100, 100])
    for s in range(5):
        cal.observe(s, [1.0, 2.0], [100, 100])
    assert cal.sizes == [115, 85]
    for s in range(5, 10):  # the new plan never took effect
        assert cal.observe(s, [1.0, 2.0], [100, 100]) is None


def test_independent_instances_agree_and_state_dict_resumes():
    speeds = [1.0, 0.6, 0.85]
    rng = random.Random(7)
    feed = []
    sizes = [100, 100, 100]
    ref = Calibrator(_cfg(), sizes)
    for step in range(200):
        times = _timings(ref.sizes, speeds, rng, 0.05)
        feed.append((step, times, list(ref.sizes)))
        ref.observe(step, times, ref.sizes)
    others = [Calibrator(_cfg(), sizes) for _ in range(3)]
    for step, times, batch in feed:
        outs = {tuple(c.observe(step, times, batch) or ()) for c in others}
        assert len(outs) == 1
    assert all(c.decisions == ref.decisions for c in others)
    # Resume from the middle: same decisions afterwards.
    a = Calibrator(_cfg(), sizes)
    for step, times, batch in feed[:95]:
        a.observe(step, times, batch)
    b = Calibrator(_cfg(), sizes)
    b.load_state_dict(a.state_dict())
    for step, times, batch in feed[95:]:
        assert a.observe(step, times, batch) == b.observe(step, times, batch)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="initial_sizes"):
        Calibrator(_cfg(), [4, 0])
    cal = Calibrator(_cfg(), [4, 4])
    with pytest.raises(ValueError, match="per_rank_compute_s"):
        cal.observe(20, [1.0], [4, 4])


def _gloo_calibrate(rank: int, world_size: int, speeds: list[float], steps: int) -> list:
    from hetero_strategy.dist import all_gather_floats

    init_gloo(rank, world_size)
    rng = random.Random(1000 + rank)  # every rank has its own noise: only the all-gather aligns them
    cal = Calibrator(_cfg(), [64] * world_size)
    for step in range(steps):
        mine = cal.sizes[rank] / speeds[rank] * (1.0 + 0.05 * rng.gauss(0.0, 1.0))
        gathered = [row[0] for row in all_gather_floats([mine])]
        cal.observe(step, gathered, cal.sizes)
    return cal.decisions


def test_ranks_agree_through_real_all_gather():
    speeds = [1.0, 0.57]
    per_rank = run_distributed(_gloo_calibrate, 2, speeds, 130, timeout=120)
    assert per_rank[0] == per_rank[1]
    assert len(per_rank[0]) >= 2
    final = per_rank[0][-1][1]
    assert final[0] / final[1] == pytest.approx(1 / 0.57, rel=0.05)


def _affine_drive(cal, rates, fixed, steps=300):
    rng = random.Random(0)
    history = [list(cal.sizes)]
    for step in range(steps):
        times = [(f + b / s) * (1 + 0.01 * rng.gauss(0.0, 1.0)) for b, s, f in zip(cal.sizes, rates, fixed)]
        new = cal.observe(step, times, cal.sizes)
        if new is not None:
            history.append(new)
    return history


def test_affine_step_cost_lands_on_the_best_split_in_one_move():
    """Step time fixed_r + b_r / rate_r (rank 1: slow and with a large fixed cost). With the probe's
    fixed costs the calibrator moves once, to the split a brute-force search calls best, and stays;
    the proportional model (no fixed costs) misjudges rank 1's per-sample speed and creeps."""
    rates, fixed, g = [400.0, 120.0], [0.005, 0.12], 256
    best = min(([b, g - b] for b in range(1, g)), key=lambda s: max(f + b / r for b, r, f in zip(s, rates, fixed)))
    cfg = _cfg(cold_start_steps=5, max_change=0.9)
    affine = _affine_drive(Calibrator(cfg, [128, 128], fixed_s=fixed), rates, fixed)
    assert affine == [[128, 128], best]  # one move, no overshoot, no churn afterwards
    proportional = _affine_drive(Calibrator(cfg, [128, 128]), rates, fixed)
    assert len(proportional) > 2 and proportional[1][1] > best[1]  # undershoots the move, then creeps


def test_fixed_costs_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match=r"fixed_s=\[0.1\] is invalid"):
        Calibrator(_cfg(), [4, 4], fixed_s=[0.1])


def _walled_drive(cal, speeds, wall_of, steps, seed=0, noise=0.01):
    """Feeds compute times b_r / speed_r and the step's wall time ``wall_of(sizes, times)``."""
    rng = random.Random(seed)
    visits = []
    for step in range(steps):
        times = _timings(cal.sizes, speeds, rng, noise)
        cal.observe(step, times, cal.sizes, wall_of(cal.sizes, times))
        visits.append(tuple(cal.sizes))
    return visits


@pytest.mark.parametrize("seed", range(6))
def test_a_move_the_measured_step_time_contradicts_is_undone(seed):
    """Compute says 'give rank 0 more' (1000 vs 570 samples/s), but past 150 samples rank 0's step
    pays 0.2 s the model cannot see (say, memory pressure). Starting from the probe's plan
    [150, 106], the calibrator tries the model's move, measures it slower and returns; a plan a
    sample beside the undone one is not tried instead, and retries back off (4, 8, 16, 32 decisions),
    so 400 steps (39 decisions) see at most 5 tries (4 by the schedule; a way back of two moves
    crosses the line twice). Without wall times it keeps the slower plan."""
    speeds, start = [1000.0, 570.0], [150, 106]

    def wall(sizes, times):
        return max(times) + (0.2 if sizes[0] > 150 else 0.0)

    cfg = _cfg(cold_start_steps=5, recalibrate_every=10, window=20)
    visits = _walled_drive(Calibrator(cfg, start), speeds, wall, steps=400, seed=seed)
    tries = sum(1 for a, b in itertools.pairwise(visits) if a[0] <= 150 < b[0])
    assert 1 <= tries <= 5, tries
    # each try lasts a period or two (the way back is taken +-max_change at a time)
    assert sum(v[0] > 150 for v in visits) <= tries * 20
    assert visits[-1] == tuple(start)
    blind = _walled_drive(Calibrator(cfg, start), speeds, lambda s, t: float("nan"), steps=400, seed=seed)
    assert blind[-1][0] > 150


def test_an_undo_moves_at_most_max_change():
    # the step gets slower and slower as rank 0 grows; after creeping (each move < 1% slower) a
    # move costs 17%: the way back to the fastest plan is taken +-max_change at a time
    cfg = _cfg(cold_start_steps=5, recalibrate_every=10, window=20, max_change=0.15)

    def wall(sizes, times):
        return 1.0 + (0.006 if sizes[0] > 140 else 0.0) + (0.17 if sizes[0] > 155 else 0.0)

    cal = Calibrator(cfg, [128, 128])
    visits = _walled_drive(cal, [1000.0, 400.0], wall, steps=300)
    assert any(v[0] > 155 for v in visits) and cal._strikes
    for old, new in itertools.pairwise(visits):
        for b0, b1 in zip(old, new):
            assert abs(b1 - b0) <= 0.15 * b0 + 1 + 1e-9, (old, new)


@pytest.mark.parametrize("comm_s", [0.0, 0.3])
def test_wall_times_that_agree_with_the_model_do_not_block_convergence(comm_s):
    # the step is the slowest rank's compute plus a fixed exchange: the better split is faster
    cfg = _cfg(cold_start_steps=5, recalibrate_every=10, window=20)
    visits = _walled_drive(Calibrator(cfg, [128, 128]), [1000.0, 570.0], lambda s, t: max(t) + comm_s, steps=300)
    assert visits[-1][0] / visits[-1][1] == pytest.approx(1 / 0.57, rel=0.05)


def test_measured_plans_survive_state_dict():
    cfg = _cfg(cold_start_steps=5, recalibrate_every=10, window=20)

    def wall(sizes, times):
        return max(times) + (0.2 if sizes[0] > 150 else 0.0)

    a = Calibrator(cfg, [150, 106])
    _walled_drive(a, [1000.0, 570.0], wall, steps=60)
    assert a.rejected and a.measured  # the slower plan was tried and undone by step 60
    b = Calibrator(cfg, [150, 106])
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() and b._strikes == a._strikes
    assert _walled_drive(a, [1000.0, 570.0], wall, 100, seed=3) == _walled_drive(b, [1000.0, 570.0], wall, 100, seed=3)


def test_online_balancer_gathers_compute_batch_and_the_slowest_wall(monkeypatch):
    """Rank 0's view: its rows and rank 1's come back from one all-gather; the calibrator gets both
    ranks' compute times and batches, and the step's wall time as the slower rank's (nan if a rank
    has none)."""
    from hetero_strategy.balance import online
    from hetero_strategy.balance.online import OnlineBalancer

    class _Sampler:
        def next_unyielded_step(self):
            return 0

        def steps_per_epoch(self):
            return 100

        def set_batch_sizes(self, sizes, from_step):
            pass

    # rank 1: (compute, batch, wall, CPU seconds after its last gradient, compute's pace)
    other = {5: (0.30, 30.0, 0.50, 0.05, 2.0), 6: (0.31, 30.0, float("nan"), 0.04, 2.0)}
    monkeypatch.setattr(online, "all_gather_floats", lambda mine: [
        mine, [x for s in sorted(other) for x in other[s]]])
    cal = Calibrator(_cfg(cold_start_steps=5, recalibrate_every=2), [34, 30])
    balancer = OnlineBalancer(cal, _Sampler())
    assert balancer.step_end(5, 0.20, 34, 0.45, 0.07, 1.0) is None  # not a decision step: nothing gathered yet
    balancer.step_end(6, 0.21, 34)  # rank 0 without a wall time or the after part
    rows = list(cal.rows)
    # own work after backward: the ranks' mean CPU seconds (0.06) at each one's pace
    assert rows[0][:3] == ((0.20, 0.30), (34, 30), 0.50) and rows[0][3] == pytest.approx((0.06, 0.12))
    # rank 0 measured nothing: rank 1's own figure, rank 0's 0
    assert rows[1][:2] == ((0.21, 0.31), (34, 30)) and math.isnan(rows[1][2]) and rows[1][3] == pytest.approx((0, 0.08))


def test_pending_rows_of_older_states_still_load():
    """Rows a checkpoint kept before the wall time (3 figures) or the after part (4) was gathered."""
    from hetero_strategy.balance.online import OnlineBalancer

    balancer = OnlineBalancer(Calibrator(_cfg(), [34, 30]), None)
    balancer.load_state_dict({"calibrator": balancer.calibrator.state_dict(),
                              "pending": [[11, 0.2, 34], [12, 0.21, 34, 0.45], [13, 0.2, 34, 0.4, 0.05, 1.5]]})
    rows = balancer._pending
    assert rows[2] == (13, 0.2, 34, 0.4, 0.05, 1.5)
    assert rows[0][:3] == (11, 0.2, 34) and all(math.isnan(x) for x in rows[0][3:])
    assert rows[1][:4] == (12, 0.21, 34, 0.45) and all(math.isnan(x) for x in rows[1][4:])


def test_a_contradicted_verdict_does_not_freeze_later_moves():
    """A move costs 7% (a fixed 0.5 s exchange hides most of the compute gain) and is undone; then
    every plan gets 5% slower (a neighbour job starts), so the fastest plan now looks slower than
    the undone one's old figure. At step 60 rank 0 becomes 3x slower than rank 1: the calibrator
    must move toward rank 1 at its next decisions (rejections in both directions along the one line
    of a 2-rank split would block every move until they expire)."""
    cfg = _cfg(cold_start_steps=5, recalibrate_every=10, window=20, max_change=0.15)
    cal = Calibrator(cfg, [150, 106])
    rng = random.Random(0)
    moves_after, slower = [], False
    for step in range(200):
        speeds = [1000.0, 570.0] if step < 60 else [300.0, 1000.0]
        times = [b / v * (1 + 0.005 * rng.gauss(0.0, 1.0)) for b, v in zip(cal.sizes, speeds)]
        slower = slower or bool(cal.rejected)
        wall = (max(times) + 0.5 + (0.037 if cal.sizes[0] > 150 else 0.0)) * (1.05 if slower else 1.0)
        if cal.observe(step, times, cal.sizes, wall) is not None and step >= 60:
            moves_after.append(step)
    assert moves_after and moves_after[0] <= 100, cal.decisions
    assert cal.sizes[0] < 70  # the equal-time split is about [59, 197]


@pytest.mark.parametrize(("slower", "undone"), [(1.0125, False), (1.3, True)])
def test_a_move_measured_slower_within_the_steps_noise_is_kept(slower, undone):
    # Steps vary +-15% around their plan's time (walls x 0.85, 1.0, 1.15, 1.0, ...). The model's first
    # move from [64, 64] is right, but its window's median came out 1.25% slower than equal shares':
    # within the steps' noise, so it is kept and the next move goes on. A plan 30% slower is undone.
    cfg = _cfg(cold_start_steps=5, recalibrate_every=10, window=20)
    cal = Calibrator(cfg, [64, 64])
    pattern = [0.85, 1.0, 1.15, 1.0]
    visits = []
    for step in range(45):
        times = [b / s for b, s in zip(cal.sizes, [339.0, 180.0])]
        base = 0.4 if cal.sizes == [64, 64] else 0.4 * slower
        cal.observe(step, times, cal.sizes, base * pattern[step % 4])
        visits.append(tuple(cal.sizes))
    first = visits[14]
    assert first[0] > 64  # the model's move toward the fast rank
    assert (visits[-1] == (64, 64)) is undone
    if not undone:
        assert visits[-1][0] > first[0]


def test_a_state_saved_before_the_spread_was_kept_still_loads():
    cal = Calibrator(_cfg(), [64, 64])
    cal.load_state_dict({"sizes": [73, 55], "rows": [], "measured": [[[64, 64], 0.4], [[73, 55], 0.5]]})
    assert cal.measured == {(64, 64): (0.4, 0.0), (73, 55): (0.5, 0.0)}
