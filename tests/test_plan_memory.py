"""The planner's memory caps: activations counted on the meta device against a hand count, caps
against the memory model's formula worked out here, and the refusal of a model no card can hold."""

from __future__ import annotations

import pytest
import torch

from hetero_strategy.config import ConfigError


def huge_linear() -> tuple[torch.nn.Module, torch.Tensor]:
    """10^10 parameters (160 GB of weights, gradients, buckets and momentum): built on the meta device only."""
    return torch.nn.Linear(100_000, 100_000, bias=False), torch.zeros(2, 100_000)


def _cluster(tmp_path, devices: str):
    from hetero_strategy.cluster.spec import read_cluster

    path = tmp_path / "cluster.yaml"
    path.write_text(f"nodes:\n  - devices: [{devices}]\n    intra: 10gbit\n")
    return read_cluster([str(path)])


def test_activations_per_sample_are_what_backward_keeps():
    """tiny_mlp: Linear(10, 20) keeps its input (10 floats), ReLU its output (20), which the second
    Linear keeps too (the same tensor: once); weights are parameters, the sum keeps nothing."""
    from hetero_strategy.cluster.model import describe_model

    assert describe_model("test_plan:tiny_mlp").activation_bytes_per_sample == 4 * (10 + 20)


def test_caps_follow_the_memory_model_and_split_a_share_into_passes(tmp_path):
    from test_plan import TINY_PARAMS

    from hetero_strategy.balance.plan import STATIC_BYTES_PER_PARAMETER, memory_caps, plan
    from hetero_strategy.cluster.model import describe_model

    cluster, model = _cluster(tmp_path, "A100-80GB, V100-32GB"), describe_model("test_plan:tiny_mlp")
    want = [int((gib * 2**30 * 0.9 - STATIC_BYTES_PER_PARAMETER * TINY_PARAMS) // 120) for gib in (80, 32)]
    assert memory_caps(cluster, model) == want  # the runtime's default margin: 10% kept free
    assert memory_caps(cluster, model, margin=0.5)[1] == int((32 * 2**30 * 0.5 - 16 * TINY_PARAMS) // 120)
    out = plan(cluster, model, 64)
    assert out["memory_caps"] == want and out["methods"]["hetero"]["passes"] == [1, 1]


def test_a_model_no_card_can_hold_is_refused_with_the_fix(tmp_path):
    from hetero_strategy.balance.plan import plan
    from hetero_strategy.cluster.model import describe_model

    with pytest.raises(ConfigError, match=r"rank 0 \(A100-80GB, 80.0 GiB\) cannot hold model='test_plan_memory:huge_linear'"
                                          r".*shard it \(FSDP2\)"):
        plan(_cluster(tmp_path, "A100-80GB"), describe_model("test_plan_memory:huge_linear"), 8)
