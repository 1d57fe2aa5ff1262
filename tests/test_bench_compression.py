"""The time-to-accuracy worker of ``bench compression`` on 2 loopback ranks, briefly.

Checks the clock charges the hook's bytes at the given link rate (``--charge-link``, the
no-namespace fallback), that both ranks see the same training (they stop alike), and that the
interface counter saw at least the bytes the hook counted.
"""

from __future__ import annotations

import argparse

import pytest
from dist_utils import init_gloo, run_distributed


def _converge(rank: int, world: int) -> dict:
    import os

    from hetero_bench import compression_worker as w
    from hetero_bench.compression_e2e import converge

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    init_gloo(rank, world)
    args = argparse.Namespace(methods=["dense_fp32", "topk"], seeds=1, steps=20, eval_every=10, target=0.5,
                              lr=0.05, momentum=0.9, charge_link=1e6)
    return converge(args, lambda m, steps, tiers, model: w.make_hook(m, steps, warmup=2, fallback=False, model=model))


def test_time_to_accuracy_charges_the_bytes_and_counts_the_wire():
    r0, r1 = run_distributed(_converge, 2, timeout=240)
    for m in ("dense_fp32", "topk"):
        a, b = r0[m][0], r1[m][0]
        assert a["accuracy"] == b["accuracy"] and a["steps_to_target"] == b["steps_to_target"]
        # at 1 Mbit/s the hook's bytes alone take this long: the clock holds at least that
        assert a["train_time_s"] >= 20 * a["hook_bytes_per_step"] * 8 / 1e6
        # loopback carries both ranks' traffic plus gloo's framing: at least what the hook counted
        assert a["wire_bytes_per_step"] >= a["hook_bytes_per_step"] > 0
        assert [c[0] for c in a["curve"]] == [10, 20]
    # 283k parameters: dense ring all-reduce on 2 ranks sends 4 B per parameter per step
    assert r0["dense_fp32"][0]["hook_bytes_per_step"] == 4 * 283_786
    assert r0["topk"][0]["hook_bytes_per_step"] < r0["dense_fp32"][0]["hook_bytes_per_step"] / 5


def test_overlap_efficiency_by_hand():
    from hetero_bench.overlap import summarise

    # one chunk: codec 0.4 s, exchange 0.3 s, so a serial hook takes 0.7 s (0) and a perfect one 0.4 s (1);
    # in four chunks the codec alone is faster (0.3 s): efficiency_same_chunks leaves that gain out
    one = {"codec_s_stages_1": [0.4, 0.4], "comm_s_stages_1": [0.3, 0.3]}
    raw = {**one, "codec_s": one["codec_s_stages_1"], "comm_s": one["comm_s_stages_1"],
           "codec_s_stages_4": [0.3, 0.3], "comm_s_stages_4": [0.3, 0.3],
           "hook_s_stages_1": [0.7, 0.7], "hook_s_stages_4": [0.4, 0.45], "setup": {}}
    out = summarise(raw)
    assert out["stages"][1]["efficiency"] == pytest.approx(0.0)
    assert out["stages"][4]["efficiency_same_chunks_spread"] == pytest.approx([0.5, 2 / 3])  # (0.6 - hook) / 0.3
    assert out["stages"][4]["efficiency_spread"] == pytest.approx([0.25 / 0.3, 1.0])  # against one chunk's 0.7 s
    assert out["stages"][4]["efficiency"] == pytest.approx((1.0 + 0.25 / 0.3) / 2)
    assert out["stages"][4]["codec_s"] == pytest.approx(0.3)
    assert out["stages"][4]["speedup_vs_one_stage"] == pytest.approx(0.7 / 0.425)


def test_overlap_bench_runs_on_loopback(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "overlap.json"
    proc = subprocess.run([sys.executable, "-m", "hetero_strategy.cli", "bench", "overlap", "--local", "--numel",
                           "100000", "--rounds", "1", "--stages", "1", "3", "--json", str(out)],
                          check=False, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["stages"]) == {"1", "3"} and report["setup"]["link"] == "loopback"
    assert report["codec_beside_exchange_s"] > 0 and report["stages"]["3"]["codec_s"] > 0
    assert 1 <= report["setup"]["auto_stages"] <= 8 and report["setup"]["mtu"] is None


def _runs(times: list[float | None], acc: float = 0.98) -> list[dict]:
    return [{"time_to_target_s": t, "accuracy": acc, "steps_to_target": None if t is None else 100, "world_size": 2,
             "batch_sizes": [32, 32], "wire_bytes_per_step": 10.0, "hook_bytes_per_step": 9.0, "step_time_s": 0.1,
             "dense_steps": 1, "decision": None, "curve": []} for t in times]


def test_the_summary_picks_the_best_powersgd_rank_keeps_the_old_keys_and_checks_the_goals():
    from hetero_bench.compression_summary import goals, ratios, summarise

    conv = {"ddp": _runs([100.0, 90.0, 110.0]), "ddp_powersgd": _runs([40.0, 50.0, 45.0]),
            "ddp_powersgd_r1": _runs([30.0, None, 35.0]), "ddp_powersgd_r2": _runs([42.0, 41.0, 43.0]),
            "topk_allreduce": _runs([33.0, 34.0, 35.0], acc=0.97), "auto": _runs([40.0, 44.0, 42.0]),
            "_setup": {}}
    m = summarise(conv, None, None)
    # r1 missed the target once: no median; of the others r2's 42 beats rank 4's 45
    assert m["ddp_powersgd_r1"]["time_to_target_s"] is None
    assert m["ddp_powersgd_best"]["rank"] == 2 and m["ddp_powersgd_best"]["time_to_target_s"] == 42.0
    assert m["dense_fp32"] is m["ddp"] and m["powersgd"] is m["ddp_powersgd"]
    assert m["ddp"]["time_to_target_spread_s"] == [90.0, 110.0]
    r = ratios(m)
    assert r["best_of_ours"] == "topk_allreduce" and r["best_of_ours_time_to_target_vs_ddp_powersgd"] == 34.0 / 45.0
    assert r["best_of_ours_accuracy_minus_dense_points"] == pytest.approx(-1.0)
    assert r["best_fixed"] == "topk_allreduce" and r["auto_time_to_target_vs_best_fixed"] == 42.0 / 34.0
    g = goals(m, r, ranks=2, unthrottled=False)
    assert g["best_of_ours_vs_ddp_powersgd"]["met"]  # 0.756 <= 0.8
    assert not g["best_of_ours_accuracy_within_half_point"]["met"]  # 1 point below DDP
    assert not g["auto_within_10pct_of_best_fixed"]["met"]  # 1.24x
