"""``hetero-strategy plan`` and the cost model under it, on hand-built clusters whose answer is worked
out here: α–β collectives, the hierarchical all-reduce, overlap, splits and speedups, the meta-device
FLOP count against its closed form, the command's JSON and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_cli import _cli

from hetero_strategy.cluster.cost import Link, Topology, allreduce_seconds, collective_seconds, step_seconds


def tiny_mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    """Linear(10, 20) -> ReLU -> Linear(20, 5) and a batch of 3 (a ``module:callable`` for the planner)."""
    return torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 5)), torch.zeros(3, 10)


TINY_PARAMS = 10 * 20 + 20 + 20 * 5 + 5


def test_collectives_alpha_beta_by_hand():
    link = Link(bytes_per_s=2.0, latency_s=0.5)
    # ring all-reduce on 4 ranks: 2*3/4 = 1.5 bytes per payload byte, 6 messages in a row
    assert collective_seconds("all_reduce", 8.0, 4, link) == pytest.approx(1.5 * 8 / 2 + 6 * 0.5)
    assert collective_seconds("all_gather", 8.0, 4, link) == pytest.approx(3 * 8 / 2 + 3 * 0.5)
    assert collective_seconds("broadcast", 8.0, 4, link) == pytest.approx(0.75 * 8 / 2 + 2 * 0.5)  # tree: log2 4
    assert collective_seconds("all_reduce", 8.0, 1, link) == 0.0
    # two nodes of 4: the ring crosses the slow link with 2*7/8 of the payload; hierarchical sends the
    # whole payload once each way between the nodes (2*1/2) and reduces inside at 100 B/s
    fast, slow = Link(100.0), Link(1.0)
    topo = Topology((4, 4), (fast, fast), (slow, slow))
    assert allreduce_seconds(8.0, topo) == pytest.approx(2 * 3 / 4 * 8 / 100 + 2 * 1 / 2 * 8 / 1)
    ring_only = Topology((4, 4), (fast, fast), (slow, slow), hierarchical=False)
    assert allreduce_seconds(8.0, ring_only) == pytest.approx(2 * 7 / 8 * 8 / 1)


def test_overlap_hides_the_exchange_up_to_its_share_of_compute():
    assert step_seconds(1.0, 0.3, overlap=0.5) == pytest.approx(1.0)  # 0.3 < 0.5: hidden
    assert step_seconds(1.0, 0.8, overlap=0.5) == pytest.approx(1.3)  # 0.5 hidden, 0.3 exposed
    assert step_seconds(1.0, 0.8, overlap=0.0) == pytest.approx(1.8)
    # the last bucket's 0.4 s starts only after backward: of the other 0.4 s, all hides under 0.5 s
    assert step_seconds(1.0, 0.8, overlap=0.5, tail_s=0.4) == pytest.approx(1.4)
    assert step_seconds(1.0, 0.8, overlap=0.5, tail_s=0.8) == pytest.approx(1.8)  # one bucket: nothing hides


def test_flops_on_the_meta_device_match_the_closed_form():
    from hetero_strategy.cluster.model import describe_model

    cost = describe_model("test_plan:tiny_mlp")
    # per sample: forward 2*in*out per layer; backward 2*in*out for the weight's gradient, and
    # another 2*in*out for the input's, except in the first layer (its input needs no gradient)
    assert cost.flops_per_sample == 2 * 10 * 20 * 2 + 2 * 20 * 5 * 3
    assert cost.parameters == TINY_PARAMS


def _yaml(tmp_path, text: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


def test_two_identical_cards_split_evenly_and_hetero_equals_ddp(tmp_path):
    from hetero_strategy.balance.plan import plan
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster

    cluster = read_cluster([_yaml(tmp_path, "overlap: 0.5\nnodes:\n  - devices: [A100-80GB, A100-80GB]\n"
                                            "    intra: 1gbit\n")])
    out = plan(cluster, describe_model("test_plan:tiny_mlp"), 16)
    ddp, hetero = out["methods"]["ddp"], out["methods"]["hetero"]
    assert ddp["batch_sizes"] == hetero["batch_sizes"] == [8, 8]
    assert ddp["step_s"] == pytest.approx(hetero["step_s"])
    compute = 8 * (2 * 10 * 20 * 2 + 2 * 20 * 5 * 3) / (0.4 * 312e12)  # A100 bf16 peak x efficiency
    comm = 4 * TINY_PARAMS / 1.25e8 + 2 * 20e-6  # W = 2: the payload once, 2 messages of 20 us
    assert ddp["step_s"] == pytest.approx(compute + comm)  # one bucket: its exchange follows backward
    assert ddp["bytes_per_rank"] == 4 * TINY_PARAMS


def test_a_two_to_one_mix_without_communication_splits_two_to_one():
    from hetero_strategy.balance.plan import plan_methods
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import PlanCluster, RankDevice

    fast, slow = RankDevice("n", "fast", "fp32", 2.0, 1e3, 2.0), RankDevice("n", "slow", "fp32", 1.0, 1e3, 1.0)
    free = Link(1e30)
    cluster = PlanCluster((fast, slow), Topology((2,), (free,), (free,)), ("nvlink", "nvlink"), overlap=0.0)
    methods = plan_methods(cluster, describe_model("test_plan:tiny_mlp"), 30)
    assert methods["hetero"].batch_sizes == [20, 10]
    assert methods["ddp"].batch_sizes == [15, 15]
    # DDP waits for the slow rank's 15 samples, hetero for 10 of them (or the fast one's 20): 1.5x
    assert methods["hetero"].samples_per_s / methods["ddp"].samples_per_s == pytest.approx(1.5)
    assert methods["hetero_auto"].codec == "dense"  # nothing to save on a free link


def test_card_table_names_its_sources_and_covers_each_cards_training_dtype():
    from importlib import resources

    from hetero_strategy.cluster.cards import load_cards

    text = resources.files("hetero_strategy.cluster").joinpath("cards.yaml").read_text()
    assert "Sources" in text and "datasheet" in text
    table = load_cards()
    assert table.cards["A100-80GB"].dtype == "bf16" and table.cards["A100-80GB"].peak_tflops() == 312
    assert table.cards["V100-32GB"].dtype == "fp16" and table.cards["V100-32GB"].peak_tflops() == 125
    for card in table.cards.values():
        assert card.dtype in card.tflops, card.name


def test_plan_command_writes_the_json_with_stable_keys(tmp_path):
    out = tmp_path / "plan.json"
    example = Path(__file__).resolve().parents[1] / "docs" / "clusters" / "two_nodes.yaml"
    code, text = _cli(["plan", str(example), "--model", "test_plan:tiny_mlp", "--json", str(out),
                       "--scale"])
    assert code == 0, text
    result = json.loads(out.read_text())
    assert set(result["methods"]) == {"ddp", "ddp_powersgd", "hetero", "hetero_auto"}
    for p in result["methods"].values():
        assert {"batch_sizes", "step_s", "samples_per_s", "bytes_per_rank", "wire_bytes_per_rank", "codec",
                "passes"} <= set(p)
        assert sum(p["batch_sizes"]) == result["global_batch"] == 32 * 16
    assert {"hetero_vs_ddp", "hetero_auto_vs_ddp", "hetero_auto_vs_ddp_powersgd"} <= set(result["speedup"])
    assert result["scale"]["worlds"] == [16, 32, 64, 128, 256, 512, 1024]
    assert len(result["memory_caps"]) == 16 and all(isinstance(c, int) and c > 0 for c in result["memory_caps"])


def test_the_shell_command_leaves_at_once_with_its_output_whole_and_its_exit_status(tmp_path):
    # From the shell `plan` skips the interpreter's teardown (cli._leave): what it printed and wrote
    # must all be there, and a refusal must still exit 2; in Python, main() returns (the test above).
    import sys

    from dist_utils import launch_env, run_command

    script = str(Path(sys.executable).parent / "hetero-strategy")
    example = Path(__file__).resolve().parents[1] / "docs" / "clusters" / "two_nodes.yaml"
    env = launch_env(PYTHONPATH=str(Path(__file__).parent))  # test_plan:tiny_mlp importable
    out, png = tmp_path / "plan.json", tmp_path / "scale.png"
    code, text = run_command([script, "plan", str(example), "--model", "test_plan:tiny_mlp", "--json", str(out),
                              "--scale", "--chart", str(png)], env=env, timeout=120)
    assert code == 0, text
    assert json.loads(out.read_text())["scale"]["worlds"][-1] == 1024 and png.stat().st_size > 10_000
    # the last lines printed reached the pipe (rich may fold the path onto a line of its own)
    assert text.count("plan: wrote") == 2 and text.rstrip().endswith("scale.png"), text[-500:]
    code, text = run_command([script, "plan", str(example), "--model", "nosuch_module_x:build"], env=env, timeout=120)
    assert code == 2 and "cannot import it" in text, text


def _profile(tmp_path, schema: str = "hetero_strategy.cluster_profile/1") -> str:
    ranks = [{"rank": i, "compute_score": s, "bandwidth_gbit_s": 10.0, "tier": "eth10g", "training_dtype": "fp32",
              "matmul_tflops": {"fp32": s}, "memory_gbps": 10.0, "device": {"name": "cpu"}} for i, s in enumerate((1.0, 0.5))]
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"schema": schema, "world_size": 2, "ranks": ranks}))
    return str(path)


def test_a_profile_stands_for_a_node_and_its_measured_speed_sets_the_split(tmp_path):
    from hetero_strategy.balance.plan import plan_methods
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster

    cluster = read_cluster([_profile(tmp_path)])
    assert [r.tflops for r in cluster.ranks] == [1.0, 0.5]
    assert plan_methods(cluster, describe_model("test_plan:tiny_mlp"), 30)["hetero"].batch_sizes == [20, 10]


@pytest.mark.parametrize(("cluster", "model", "needle"), [
    ("nodes:\n  - devices: [A200]\n", "test_plan:tiny_mlp", "nodes[0].devices[0]='A200' is invalid: unknown card"),
    ("nodes:\n  - devices: [T4]\n    inter: warp\n", "test_plan:tiny_mlp", "nodes[0].inter='warp' is invalid"),
    ("nodes:\n  - devices: [T4]\n    gpus: 2\n", "test_plan:tiny_mlp", "nodes[0].gpus=2 is invalid: unknown key"),
    ("nodes: []\n", "test_plan:tiny_mlp", "nodes=[] is invalid"),
    ("efficiency: 2\nnodes:\n  - devices: [T4]\n", "test_plan:tiny_mlp", "efficiency=2 is invalid"),
    ("nodes:\n  - devices: [T4]\n", "no_such_module:model", "model='no_such_module:model' is invalid: cannot import"),
    ("nodes:\n  - devices: [T4]\n", "gpt5", "model='gpt5' is invalid: choose one of"),
])
def test_bad_input_is_one_line_naming_field_value_and_fix(tmp_path, cluster, model, needle):
    code, text = _cli(["plan", _yaml(tmp_path, cluster), "--model", model])
    assert code == 2 and needle in text, text
    assert len(text.strip().splitlines()) == 1, text


def test_a_profile_of_another_version_is_refused(tmp_path):
    code, text = _cli(["plan", _profile(tmp_path, "hetero_strategy.cluster_profile/0"), "--model", "test_plan:tiny_mlp"])
    assert code == 2 and "profile=" in text and "re-run `hetero-strategy profile" in text, text
