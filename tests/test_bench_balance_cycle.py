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
