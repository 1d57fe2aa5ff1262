"""Cluster profiler: tier thresholds, busbw formula, profile JSON round trip, real probes.

Oracles: hand-computed thresholds and nccl-tests' busbw formula, the configured link rate and CPU
quota of an emulated cluster (root), and the profile's own schema contract for the loader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from dist_utils import init_gloo, run_distributed

from hetero_strategy.balance.shares import capacity, split_batch
from hetero_strategy.cluster.probes import bus_bandwidth_factor, sweep_sizes
from hetero_strategy.cluster.profile import SCHEMA, load_profile, run_profile, save_profile
from hetero_strategy.cluster.tiers import classify_tier, parse_rate, parse_size


@pytest.mark.parametrize(("gbit", "tier"), [
    (900.0, "nvlink"), (200.1, "nvlink"), (200.0, "ib"), (100.0, "ib"), (99.9, "eth10g"), (9.4, "eth10g"),
    (5.0, "eth10g"), (4.99, "eth1g"), (0.94, "eth1g"), (0.0, "eth1g"),
])
def test_tier_thresholds(gbit, tier):
    assert classify_tier(gbit) == tier


def test_tier_nvlink_flag_and_bad_values():
    assert classify_tier(20.0, nvlink=True) == "nvlink"
    with pytest.raises(ValueError, match="bandwidth"):
        classify_tier(float("nan"))
    assert parse_rate("100mbit") == 1e8 and parse_rate("1.5gbit") == 1.5e9 and parse_rate("125mbps") == 1e9
    with pytest.raises(ValueError, match="link='fast'"):
        parse_rate("fast")
    assert parse_size("4MB") == 4 << 20 and parse_size("4096") == 4096 and parse_size("64KB") == 65536
    with pytest.raises(ValueError, match="bytes="):
        parse_size("lots")


def test_busbw_factor_and_sweep_sizes():
    assert [bus_bandwidth_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    assert sweep_sizes(max_bytes=256 << 20)[:3] == [1024, 4096, 16384]
    assert sweep_sizes(max_bytes=256 << 20)[-1] == 256 << 20
    assert sweep_sizes(max_bytes=10_000) == [1024, 4096, 10_000]


def test_single_process_profile_round_trip(tmp_path):
    profile = run_profile(matmul_n=128, budget_s=0.02)
    (rank,) = profile["ranks"]
    assert profile["schema"] == SCHEMA and profile["world_size"] == 1 and profile["allreduce"] == []
    assert rank["matmul_tflops"]["fp32"] > 0 and rank["memory_gbps"] > 0
    assert rank["compute_score"] == 1.0 and rank["training_dtype"] == "fp32"
    path = tmp_path / "p.json"
    save_profile(profile, path)
    inputs = load_profile(path)
    assert inputs.compute == [1.0] and inputs.bandwidth_gbit_s == [1.0]
    data = json.loads(path.read_text())
    data["schema"] = "something/0"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema"):
        load_profile(path)


def test_loader_feeds_the_planner(tmp_path):
    # A hand-written two-rank profile: the planner's split follows compute and bandwidth.
    ranks = [{"rank": 1, "compute_score": 0.5, "bandwidth_gbit_s": 1.0, "tier": "eth1g"},
             {"rank": 0, "compute_score": 1.0, "bandwidth_gbit_s": 1.0, "tier": "eth1g"}]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": SCHEMA, "ranks": ranks}))
    inputs = load_profile(path)
    assert inputs.compute == [1.0, 0.5] and inputs.tiers == ["eth1g", "eth1g"]
    # alpha=0.7 on compute (2:1), beta=0.3 on equal bandwidth -> shares 0.617 / 0.383.
    assert split_batch(300, capacity(inputs.compute, inputs.bandwidth_gbit_s)) == [185, 115]


def _profile_rank(rank: int, world_size: int) -> dict:
    init_gloo(rank, world_size)
    return run_profile(max_bytes=64 << 10, p2p_bytes=64 << 10, matmul_n=64, budget_s=0.02, latency_iters=20)


def test_two_rank_profile_on_loopback():
    a, b = run_distributed(_profile_rank, 2, timeout=120)
    assert a["ranks"] == b["ranks"] and a["world_size"] == 2
    assert [row["bytes"] for row in a["allreduce"]] == [1024, 4096, 16384, 65536]
    for row in a["allreduce"]:
        assert row["busbw_gbit_s"] == pytest.approx(row["algbw_gbit_s"])  # 2(n-1)/n = 1 for n = 2
        assert row["algbw_gbit_s"] == pytest.approx(row["bytes"] * 8 / row["time_s"] / 1e9)
    p2p = a["p2p_gbit_s"]
    assert p2p[0][0] is None and p2p[1][1] is None and p2p[0][1] > 0 and p2p[1][0] > 0
    for r in a["ranks"]:
        assert r["latency_us"]["p50_us"] <= r["latency_us"]["p99_us"]
        assert r["bandwidth_gbit_s"] == max(p2p[0][1], p2p[1][0])


@pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root (namespaces, tc, cgroups)")
def test_profile_under_emulator_sees_slow_link_and_quota(tmp_path):
    out = tmp_path / "cluster.json"
    cmd = [sys.executable, "-m", "hetero_strategy.cli", "emulate", "--no-measure", "--compute", "1.0,0.4",
           "--link", "1gbit,50mbit", "--", sys.executable, "-m", "hetero_strategy.cli", "profile",
           "--max-bytes", "64KB", "--p2p-bytes", "1MB", "--matmul-n", "256", "--budget", "0.3", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["emulated"] == "namespaces"
    # Both directions cross the 50 Mbit/s port of rank 1.
    for i, j in ((0, 1), (1, 0)):
        assert data["p2p_gbit_s"][i][j] == pytest.approx(0.05, rel=0.25)
    assert [r["tier"] for r in data["ranks"]] == ["eth1g", "eth1g"]
    inputs = load_profile(out)
    assert inputs.compute[0] == 1.0 and inputs.compute[1] < 0.75  # 40% quota: ideally 0.4
