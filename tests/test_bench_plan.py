"""``bench plan``'s comparison of predicted and measured figures, from hand-built records (the
benchmark itself is not a test); and a profile's timed model step reaching the planner."""

from __future__ import annotations

import json

import pytest
from hetero_bench.plan_summary import balance_round, codec_rounds, compare, summarise


def _rank(starts: list[float], batches: list[int], sent: list[int] | None) -> dict:
    return {"starts": starts, "batches": batches, "compute_s": [0.1] * len(batches)} | ({"sent": sent} if sent else {})


def test_a_balance_round_takes_the_windows_median_step_and_bytes():
    # rank 0's steps last 1, 2, 2, 3, 9 s: over the last 3 steps the median is 3; the counter grows by
    # 10, 10, 40, 50, 60 (rank 0) and 5, 5, 20, 30, 30 (rank 1): medians 50 and 30 over the last 3
    raw = {"ddp": [_rank([0, 1, 3, 5, 8, 17], [4] * 5, [0, 10, 20, 60, 110, 170]),
                   _rank([0, 1, 3, 5, 8, 17], [4] * 5, [0, 5, 10, 30, 60, 90])]}
    got = balance_round(raw, measure=3)["ddp"]
    assert got["step_s"] == 3
    assert got["bytes_per_rank"] == pytest.approx((50 + 30) / 2)
    assert got["batch_sizes"] == [4, 4]
    no_count = balance_round({"ddp": [_rank([0, 1, 2, 3], [4] * 3, None)] * 2}, measure=2)["ddp"]
    assert no_count["bytes_per_rank"] is None


def test_codec_rounds_reads_the_steptime_workers_lists():
    steptime = {"ddp": {"step_s": [4.0, 4.2], "wire_bytes": [100, 110], "bytes": [1, 1]},
                "topk": {"step_s": [0.4, 0.5], "wire_bytes": [3, 4], "bytes": [1, 1]}, "_tier": None}
    assert codec_rounds(steptime, ["ddp", "topk"]) == {"ddp": {"step_s": [4.0, 4.2], "bytes_per_rank": [100.0, 110.0]},
                                                       "topk": {"step_s": [0.4, 0.5], "bytes_per_rank": [3.0, 4.0]}}


def test_compare_errors_ordering_and_goals_by_hand():
    predicted = {"ddp": {"step_s": 2.0, "bytes_per_rank": 100.0, "codec": "dense"},
                 "hetero": {"step_s": 1.0, "bytes_per_rank": 100.0, "codec": "dense"},
                 "only_predicted": {"step_s": 0.1, "bytes_per_rank": 1.0}}
    measured = {"ddp": {"step_s": [1.9, 2.5, 2.0], "bytes_per_rank": [104.0, 105.0, 106.0]},
                "hetero": {"step_s": [1.2, 1.25, 1.3], "bytes_per_rank": [95.0, 100.0, 99.0]},
                "only_measured": {"step_s": [0.01], "bytes_per_rank": [1.0]}}
    out = compare(predicted, measured)
    assert set(out["methods"]) == {"ddp", "hetero"}
    ddp, hetero = out["methods"]["ddp"], out["methods"]["hetero"]
    assert ddp["measured_step_s"] == 2.0 and ddp["measured_step_spread_s"] == [1.9, 2.5]
    assert ddp["step_error"] == pytest.approx(0.0)
    assert ddp["bytes_error"] == pytest.approx(100 / 105 - 1)
    assert hetero["step_error"] == pytest.approx(1.0 / 1.25 - 1)  # -20%: outside the 15% goal
    assert hetero["codec"] == "dense"
    assert out["ranked_first"] == out["measured_fastest"] == "hetero"
    assert out["max_abs_step_error"] == pytest.approx(0.2)
    assert out["goals"] == {"step_within_15pct": False, "bytes_within_10pct": True,
                            "ranked_first_within_5pct_of_fastest": True}


def test_ordering_holds_within_five_percent_of_the_fastest_and_not_beyond():
    def config(first_measured: float) -> dict:
        predicted = {"a": {"step_s": 1.0, "bytes_per_rank": 1.0}, "b": {"step_s": 2.0, "bytes_per_rank": 1.0}}
        return compare(predicted, {"a": {"step_s": [first_measured], "bytes_per_rank": [1.0]},
                                   "b": {"step_s": [1.0], "bytes_per_rank": [1.0]}})

    near, far = config(1.04), config(1.06)
    assert near["ranked_first"] == "a" and near["measured_fastest"] == "b"
    assert near["goals"]["ranked_first_within_5pct_of_fastest"]
    assert not far["goals"]["ranked_first_within_5pct_of_fastest"]
    overall = summarise({"near": near, "far": far})
    assert overall["goals"]["ranked_first_within_5pct_of_fastest"] is False
    assert overall["goals"]["bytes_within_10pct"] is True
    json.dumps(overall)  # the result is written as JSON


def test_one_run_predicted_twice_is_one_first_measured_as_the_median_of_both():
    # hetero_auto keeping dense is hetero: the same codec, split and predicted 0.223 s; their runs
    # measured 0.252 and 0.228 (noise). They are one first, measured as the median of both runs'
    # rounds (0.240), not the better: 8% behind a third method at 0.222, though 0.228 is within 5%.
    def config(auto: dict, third: float) -> dict:
        predicted = {"hetero": {"step_s": 0.223, "bytes_per_rank": 1.0, "codec": "dense", "batch_sizes": [54, 10]},
                     "hetero_auto": {"step_s": 0.223, "bytes_per_rank": 1.0, "codec": "dense",
                                     "batch_sizes": [54, 10], **auto},
                     "ddp": {"step_s": 0.3, "bytes_per_rank": 1.0, "codec": "dense", "batch_sizes": [32, 32]}}
        return compare(predicted, {"hetero": {"step_s": [0.252], "bytes_per_rank": [1.0]},
                                   "hetero_auto": {"step_s": [0.228], "bytes_per_rank": [1.0]},
                                   "ddp": {"step_s": [third], "bytes_per_rank": [1.0]}})

    tie = config({}, 0.32)
    assert tie["ranked_first_tied"] == ["hetero", "hetero_auto"] and tie["measured_fastest"] == "hetero_auto"
    assert tie["ranked_first_behind_fastest"] == 0.0 and tie["goals"]["ranked_first_within_5pct_of_fastest"]
    beaten = config({}, 0.222)
    assert beaten["ranked_first_behind_fastest"] == pytest.approx(0.240 / 0.222 - 1)
    assert not beaten["goals"]["ranked_first_within_5pct_of_fastest"]
    # a prediction 1% apart, or another codec at the same time, is an order the planner is held to
    for other in ({"step_s": 0.223 * 1.01}, {"codec": "fp16"}):
        order = config(other, 0.32)
        assert order["ranked_first"] == "hetero" and order["ranked_first_tied"] == ["hetero"]
        assert order["ranked_first_behind_fastest"] == pytest.approx(0.252 / 0.228 - 1)
        assert not order["goals"]["ranked_first_within_5pct_of_fastest"]


def test_a_profiles_timed_model_step_rates_the_ranks(tmp_path):
    """A profile whose ranks timed the model: the planner's compute is b / rate + fixed + optimizer + the
    dense hook, not TFLOP/s; measured on CPUs, it plans gloo, whose fp16 halves only the link's share."""
    from hetero_strategy.balance.plan import predict
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.profile import SCHEMA
    from hetero_strategy.cluster.spec import read_cluster
    from hetero_strategy.hooks.auto import buckets_of

    spec = "test_plan:tiny_mlp"
    ranks = [{"rank": k, "device": {"kind": "cpu", "name": "cpu"}, "training_dtype": "fp32",
              "matmul_tflops": {"fp32": 1.0}, "memory_gbps": 10.0, "compute_score": 1.0 / (k + 1),
              "bandwidth_gbit_s": 1.0, "tier": "eth1g", "latency_us": {"p50_us": 100.0},
              "model_step": {"model": spec, "samples_per_s": 100.0 / (k + 1), "fixed_s": 0.006,
                             "optimizer_s": 0.004, "codec_s": {"topk_allreduce density 0.01": 0.05 * (k + 1)},
                             "hook_s": {"topk_allreduce density 0.01": 0.08 * (k + 1), "dense": 0.002 * (k + 1)}}}
             for k in range(2)]
    # an all-reduce of 4 MB in 0.04 s: 100 MB/s of payload; on 2 ranks each sends it once
    doc = {"schema": SCHEMA, "backend": "gloo", "ranks": ranks,
           "allreduce": [{"bytes": 1 << 10, "time_s": 1e-3, "algbw_gbit_s": 0.008, "busbw_gbit_s": 0.008},
                         {"bytes": 4_000_000, "time_s": 0.04, "algbw_gbit_s": 0.8, "busbw_gbit_s": 0.8}]}
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    cluster = read_cluster([str(path)])
    # the link (1 Gbit/s point to point) takes 0.8 of the all-reduce's time, the CPU's sum the rest;
    # half of compute may hide the exchange, on CPUs as on GPUs
    assert cluster.backend == "gloo" and cluster.wire_share == pytest.approx(0.8)
    assert cluster.overlap == pytest.approx(0.5)
    model = describe_model(spec)
    got = predict(cluster, model, 20, "dense")
    assert got.batch_sizes == [10, 10]
    # the slower rank: its fixed part, the optimizer, 10 samples, DDP's buckets (the dense hook as timed)
    compute = 0.006 + 0.004 + 10 / 50.0 + 0.004
    comm = 4 * model.parameters / 1e8 + 1e-3  # payload at 100 MB/s + the smallest all-reduce's mean time
    assert got.compute_s == pytest.approx(compute) and got.comm_s == pytest.approx(comm)
    assert len(buckets_of(model.shapes)) == 1  # so the whole exchange follows backward: nothing hides
    assert got.step_s == pytest.approx(compute + comm)
    # fp16 halves the link's share and not the CPU's: 0.6 of fp32's time
    half = predict(cluster, model, 20, "fp16")
    assert half.comm_s == pytest.approx(0.6 * 4 * model.parameters / 1e8 + 1e-3)
    # the hook's work as timed under DDP (not auto's stand-in), on each rank's compute: the slower rank's 0.16 s
    assert predict(cluster, model, 20, "topk_allreduce").compute_s == pytest.approx(compute - 0.004 + 0.16)
    hetero = predict(cluster, model, 30, "dense", even=False)
    assert hetero.batch_sizes == [20, 10]  # equal finishing times: 0.01 + 20/100 = 0.01 + 10/50


def test_profile_refuses_a_model_it_cannot_import_before_any_probe(tmp_path):
    from test_cli import _cli

    code, text = _cli(["profile", "--model", "nosuch_module_x:build", "--json", str(tmp_path / "p.json")])
    assert code == 2 and "model='nosuch_module_x:build' is invalid: cannot import it" in text, text
    assert not (tmp_path / "p.json").exists()


def test_the_plans_split_reaches_the_hetero_runs_and_the_probe_runs_without_one():
    # bench plan runs hetero and hetero_codec at the planner's split: the worker's --plan-sizes
    import argparse

    from hetero_bench.balance_workload import hetero_options

    args = argparse.Namespace(overlap_comm="on", steps=12, measure=6, sizes=None,
                              plan_sizes=["hetero=52,12", "hetero_codec=49,15"])
    assert hetero_options("hetero", args, 2)["batch_sizes"] == [52, 12]
    codec = hetero_options("hetero_codec", args, 2)
    assert codec["batch_sizes"] == [49, 15] and codec["compression"] == "auto"
    assert "batch_sizes" not in hetero_options("hetero_tiered", args, 2)  # not planned: its own probe
    assert "batch_sizes" not in hetero_options("hetero", argparse.Namespace(overlap_comm="on", plan_sizes=None), 2)
    for bad in (["hetero52,12"], ["hetero_cal=52,12"], ["hetero=52,x"], ["hetero=0,64"]):
        with pytest.raises(ValueError, match="--plan-sizes"):
            hetero_options("hetero", argparse.Namespace(overlap_comm="on", plan_sizes=bad), 2)


def test_on_cpu_ranks_the_exchanges_host_work_runs_on_their_own_cores(tmp_path):
    """gloo on CPU ranks whose profiles read their share of a core (0.8 and 0.4): the part of the
    all-reduce's bandwidth term that is not its link's (0.2 here) is reduction and copying on each
    rank's core, where backward cannot hide it; the 0.4-core rank pays it as measured, the 0.8 one
    at half of that; the hetero split counts it. fp16 reduces as many entries (the same host work)
    and halves the link's part only."""
    from hetero_strategy.balance.plan import predict
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.profile import SCHEMA
    from hetero_strategy.cluster.spec import read_cluster

    spec = "test_plan:tiny_mlp"
    ranks = [{"rank": k, "device": {"kind": "cpu", "name": "cpu"}, "training_dtype": "fp32",
              "matmul_tflops": {"fp32": 1.0}, "memory_gbps": 10.0, "compute_score": 1.0,
              "bandwidth_gbit_s": 1.0, "tier": "eth1g", "latency_us": {"p50_us": 100.0},
              "model_step": {"model": spec, "samples_per_s": 100.0 / (k + 1), "fixed_s": 0.01, "optimizer_s": 0.0,
                             "cpu_share": 0.8 / (k + 1), "hook_s": {"dense": 0.0, "fp16": 0.0}}}
             for k in range(2)]
    doc = {"schema": SCHEMA, "backend": "gloo", "ranks": ranks,
           "allreduce": [{"bytes": 1 << 10, "time_s": 1e-3, "algbw_gbit_s": 0.008, "busbw_gbit_s": 0.008},
                         {"bytes": 4_000_000, "time_s": 1600.0, "algbw_gbit_s": 2e-5, "busbw_gbit_s": 0.8}]}
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    cluster = read_cluster([str(path)])
    assert [r.cpu_share for r in cluster.ranks] == [0.8, 0.4]
    model = describe_model(spec)
    band = 4 * model.parameters / 2500  # a slow link (2.5 kB/s of payload) for a tiny model: ~0.5 s
    comm = band + 1e-3  # + the smallest all-reduce's mean: latency, the link's
    host = 0.2 * band  # 1 - wire_share (0.8) of the bandwidth term: the reduction's share
    got = predict(cluster, model, 20, "dense")
    # the 0.4-core rank: 0.01 + 10 / 50 + all of the host work; one bucket, so the link's part follows
    assert got.compute_s == pytest.approx(0.01 + 10 / 50 + host)
    assert got.step_s == pytest.approx(got.compute_s + comm - host)
    # fp16: 0.6 of fp32's time (the link's 0.8 halved); the same entries reduced on the cores
    half = predict(cluster, model, 20, "fp16")
    assert half.comm_s == pytest.approx(0.6 * band + 1e-3)
    assert half.compute_s == pytest.approx(0.01 + 10 / 50 + host)
    assert half.step_s == pytest.approx(half.compute_s + 0.4 * band + 1e-3)
    # equal finishing times with the host work in each rank's fixed cost (rank 0 pays half of it):
    # 0.01 + host / 2 + b0 / 100 = 0.01 + host + b1 / 50, b0 + b1 = 30
    b1 = (30 / 100 - host / 2) / (1 / 100 + 1 / 50)
    assert round(b1) == 8  # 10 without the host work
    assert predict(cluster, model, 30, "dense", even=False).batch_sizes == [22, 8]
    # an accelerator, or a rank reading a whole core (it may have more), keeps the exchange on the link
    accel = [dict(r, device={"kind": "cuda", "name": "gpu"}) for r in ranks]
    path.write_text(json.dumps(dict(doc, ranks=accel)))
    assert predict(read_cluster([str(path)]), model, 20, "dense").compute_s == pytest.approx(0.01 + 10 / 50)
    whole = [dict(r, model_step=dict(r["model_step"], cpu_share=1.0)) for r in ranks]
    path.write_text(json.dumps(dict(doc, ranks=whole)))
    assert predict(read_cluster([str(path)]), model, 20, "dense").compute_s == pytest.approx(0.01 + 10 / 50)


def test_per_round_predictions_combine_to_their_medians_and_the_middle_rounds_split():
    # three rounds, each predicted from its own profile: steps 0.30, 0.20, 0.25 -> 0.25, with that
    # round's split; bytes 10, 30, 20 -> 20; one round alone is itself
    from hetero_bench.plan_summary import combine_rounds

    rounds = [{"hetero": {"step_s": s, "bytes_per_rank": b, "wire_bytes_per_rank": b + 1, "batch_sizes": sizes}}
              for s, b, sizes in ((0.30, 10.0, [50, 14]), (0.20, 30.0, [54, 10]), (0.25, 20.0, [52, 12]))]
    got = combine_rounds(rounds)["hetero"]
    assert got["step_s"] == pytest.approx(0.25) and got["batch_sizes"] == [52, 12]
    assert got["bytes_per_rank"] == 20.0 and got["wire_bytes_per_rank"] == 21.0
    assert got["step_rounds_s"] == [0.30, 0.20, 0.25]
    assert combine_rounds(rounds[:1])["hetero"]["step_s"] == 0.30
    out = compare(combine_rounds(rounds), {"hetero": {"step_s": [0.25, 0.26, 0.24], "bytes_per_rank": [21.0]}})
    assert out["methods"]["hetero"]["step_error"] == pytest.approx(0.0)
    assert out["methods"]["hetero"]["predicted_step_rounds_s"] == [0.30, 0.20, 0.25]


def test_two_rounds_combine_to_their_mean_and_errors_pair_round_with_round():
    # an even count: the median is the mean; the other fields are the lower round's. Paired errors:
    # each round's prediction over the median of that round's measurements (2 per round here)
    from hetero_bench.plan_summary import combine_rounds

    rounds = [{"ddp": {"step_s": 0.4, "bytes_per_rank": 1.0, "batch_sizes": [8, 8]}},
              {"ddp": {"step_s": 0.2, "bytes_per_rank": 1.0, "batch_sizes": [9, 7]}}]
    got = combine_rounds(rounds)["ddp"]
    assert got["step_s"] == pytest.approx(0.3) and got["batch_sizes"] == [9, 7]
    out = compare(combine_rounds(rounds), {"ddp": {"step_s": [0.5, 0.3, 0.1, 0.5], "bytes_per_rank": [1.0]}})
    assert out["methods"]["ddp"]["step_error_rounds"] == pytest.approx([0.4 / 0.4 - 1, 0.2 / 0.3 - 1])
    odd = compare(combine_rounds(rounds), {"ddp": {"step_s": [0.5, 0.3, 0.1], "bytes_per_rank": [1.0]}})
    assert odd["methods"]["ddp"]["step_error_rounds"] is None  # 3 measurements do not split into 2 rounds


def test_from_json_predicts_a_stored_run_again_and_keeps_where_it_was_measured(tmp_path):
    """--from-json on the committed result: no emulator; the stored run's commit is kept as
    ``measured_commit`` (``commit`` is the checkout that predicted), and the measurements are the
    stored ones."""
    import argparse

    from hetero_bench import RESULTS
    from hetero_bench.plan import add_arguments, run

    stored = json.loads((RESULTS / "plan.json").read_text())
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "again.json"
    args = parser.parse_args(["--from-json", str(RESULTS / "plan.json"), "--configs", "2rank_100mbit",
                              "--json", str(out)])
    assert run(args) == 0
    got = json.loads(out.read_text())
    assert got["measured_commit"] == (stored.get("measured_commit") or stored["commit"])
    again, before = got["configs"]["2rank_100mbit"], stored["configs"]["2rank_100mbit"]
    assert again["measured_rounds"] == before["measured_rounds"]
    assert set(again["methods"]) == set(before["methods"])
    assert again["ranked_first_tied"] == [again["ranked_first"]]  # five codecs: no two runs alike
