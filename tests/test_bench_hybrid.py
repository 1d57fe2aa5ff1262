"""``bench hybrid``'s figures on hand-built curves, and one short run of its worker on loopback."""

from __future__ import annotations

import json
import sys

import pytest
from dist_utils import launch_env, run_command
from hetero_bench._ranks import worker
from hetero_bench.hybrid import summarise, time_to_target


def _run(curve, accuracy, phases=()):
    return {"curve": curve, "accuracy": accuracy, "train_s": curve[-1][2], "phases": list(phases),
            "batch_sizes": [41, 23]}


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    curve = [(4, 0.5, 1.0), (8, 0.95, 2.5), (12, 0.9, 3.0), (16, 0.97, 4.0)]
    assert time_to_target(curve, 0.95) == 2.5
    assert time_to_target(curve, 0.96) == 4.0
    assert time_to_target(curve, 0.99) is None


def test_ratios_pair_seeds_and_a_missed_target_leaves_the_median_out():
    runs = {
        "sync": [_run([(8, 0.96, 6.0)], 0.98), _run([(8, 0.96, 9.0)], 0.99)],
        "sync_topk": [_run([(8, 0.96, 4.0)], 0.97), _run([(8, 0.9, 4.0)], 0.93)],  # seed 1 never gets there
        "hybrid": [_run([(8, 0.96, 2.0)], 0.975), _run([(8, 0.96, 4.5)], 0.985)],
    }
    out = summarise(runs, 0.95)
    assert out["modes"]["sync"]["time_to_target_s"] == 7.5 and out["modes"]["sync_topk"]["time_to_target_s"] is None
    assert out["ratios"]["hybrid_speedup_vs_sync_per_seed"] == [3.0, 2.0]  # 6/2 and 9/4.5, seed by seed
    assert out["ratios"]["hybrid_speedup_vs_sync"] == 2.5
    assert out["ratios"]["hybrid_speedup_vs_sync_topk_per_seed"] == [2.0]  # only the seed both reached
    assert out["ratios"]["hybrid_accuracy_minus_sync"] == pytest.approx(0.98 - 0.985)


def test_the_worker_runs_every_mode_to_the_end_on_two_ranks(tmp_path):
    """One short epoch per mode (unequal step counts included) ends on both ranks: no hang."""
    module = worker("hybrid_worker")[1:]  # -m hetero_bench.hybrid_worker; puts benchmarks/ on PYTHONPATH
    env = launch_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", env["MASTER_PORT"], *module,
           str(tmp_path), "--seeds", "1", "--epochs", "1", "--batch", "96", "--capacities", "1.0,0.5"]
    rc, log = run_command(cmd, env=env, timeout=120)
    assert rc == 0, log[-3000:]
    ranks = [json.loads((tmp_path / f"hybrid_r{r}.json").read_text()) for r in (0, 1)]
    assert set(ranks[0]) == {"sync", "sync_topk", "hybrid", "hybrid_equal"}
    for mode in ranks[0]:
        a, b = ranks[0][mode][0], ranks[1][mode][0]
        assert a["accuracy"] == b["accuracy"]  # the same model on both ranks at every evaluation
        assert [x[:2] for x in a["curve"]] == [x[:2] for x in b["curve"]]
    assert ranks[0]["hybrid_equal"][0]["batch_sizes"] == [96, 96] and ranks[0]["hybrid"][0]["batch_sizes"] == [128, 64]
