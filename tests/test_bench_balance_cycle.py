"""``bench balance``'s cycle: the sweep's splits and the trainings' splits taking turns in one launch
(hetero_bench/balance_cycle.py), on two real gloo ranks; and which arms the driver asks for."""

from __future__ import annotations

import argparse

import pytest
from dist_utils import run_distributed
from hetero_bench.balance_cycle import cycle, parse_arms


def _cycle_rank(rank: int, world: int) -> dict:
    import torch

    torch.set_num_threads(1)
    args = argparse.Namespace(arms="ddp;6,2;4,4", blocks=2, block_steps=2, batch=4, model="resnet18_l3",
                              overlap_comm="on", lr=0.02, accuracy=False)
    return cycle(args, world)


def test_every_arm_takes_its_turns_at_its_own_split_on_two_ranks():
    ranks = run_distributed(_cycle_rank, 2, timeout=180)
    arms = [r["arms"] for r in ranks]
    assert [a["sizes"] for a in arms[0]] == [None, [6, 2], [4, 4]]
    # plain DDP at the per-rank batch; the hetero runtime at each split's own share on each rank
    assert [a["batch"] for a in arms[0]] == [4, 6, 4] and [a["batch"] for a in arms[1]] == [4, 2, 4]
    for arm in arms[0]:  # one figure per block, each a real step's time
        assert len(arm["step_s"]) == 2 and all(0 < t < 30 for t in arm["step_s"])


def test_arms_are_parsed_or_refused_with_the_flag_and_the_form():
    assert parse_arms("ddp; 91,37 ;100,28") == [None, [91, 37], [100, 28]]
    for bad in ("", "ddp;91,x", "0,128", "ddp;;1,1"):
        with pytest.raises(ValueError, match="--arms=.*'ddp' or per-rank batch sizes"):
            parse_arms(bad)


def test_the_driver_measures_plain_ddp_the_trainings_splits_and_the_sweep_each_once():
    from hetero_bench.balance import _arms

    raw = {"hetero": [{"final_sizes": [91, 37]}], "hetero_cal": [{"final_sizes": [88, 40]}],
           "hetero_tiered": [{"final_sizes": [70, 58]}]}  # compressed: its split is not a dense arm
    sweep = [[82, 46], [91, 37], [100, 28]]
    assert _arms(raw, ["ddp", "hetero", "hetero_cal", "hetero_tiered"], sweep) == [
        None, [91, 37], [88, 40], [82, 46], [100, 28]]
    assert _arms(raw, ["hetero"], sweep) == [[91, 37], [82, 46], [100, 28]]


def test_a_round_takes_the_sweep_and_each_trainings_split_from_its_cycle():
    # global batch 8; the cycle's median block steps: DDP 0.4 s, [6, 2] 0.2 s, [5, 3] 0.25 s, [7, 1] 0.5 s.
    # The static run ended on [6, 2] (a swept split too), the calibrated on [5, 3]; the tiered run
    # compresses, so no dense arm stands for it
    from hetero_bench.balance import _round

    def rank(sizes: list[int] | None, k: int) -> dict:
        b = 4 if sizes is None else sizes[k]
        out = {"starts": [0.0, 0.3, 0.6, 0.9, 1.2], "batches": [b] * 4, "compute_s": [0.2] * 4}
        return out | ({"final_sizes": sizes} if sizes else {})

    solo = [{"starts": [0.1 * i for i in range(8)], "ar_times": [0.01], "grad_bytes": 4} for _ in range(2)]
    raw = {"solo": solo, "ddp": [rank(None, k) for k in range(2)], "hetero": [rank([6, 2], k) for k in range(2)],
           "hetero_cal": [rank([5, 3], k) for k in range(2)], "hetero_tiered": [rank([4, 4], k) for k in range(2)],
           "cycle": [{"sizes": None, "step_s": [0.4, 0.3, 0.5]}, {"sizes": [6, 2], "step_s": [0.2, 0.1, 0.3]},
                     {"sizes": [5, 3], "step_s": [0.25, 0.25, 0.9]}, {"sizes": [7, 1], "step_s": [0.5, 0.5, 0.5]}]}
    got = _round(raw, ["ddp", "hetero", "hetero_cal", "hetero_tiered"], [[6, 2], [7, 1]],
                 argparse.Namespace(batch=4, measure=3))
    assert got["sweep"] == [{"sizes": [6, 2], "samples_per_s": pytest.approx(8 / 0.2)},
                            {"sizes": [7, 1], "samples_per_s": pytest.approx(8 / 0.5)}]
    assert got["ddp_split_samples_per_s"] == pytest.approx(8 / 0.4)
    assert got["hetero_split_samples_per_s"] == pytest.approx(8 / 0.2)
    assert got["hetero_cal_split_samples_per_s"] == pytest.approx(8 / 0.25)
    assert "hetero_tiered_split_samples_per_s" not in got
    assert got["hetero_samples_per_s"] == pytest.approx(8 / 0.3)  # its own run's figure stays as it was
