"""Per-device precision on bare DDP (2 gloo ranks, batches [3, 13]): mixed dtypes stay in sync.

* rank 0 autocasts in bf16, rank 1 in fp32: after 20 steps the ranks hold bitwise-equal weights,
  within bf16 tolerance of one-process fp32 SGD (dense) or of the all-fp32 run of the same
  compression (Top-K, 1-bit, fp16 wire, PowerSGD);
* rank 0 in fp16 with loss scaling, an inf injected into rank 1's loss at step 7: both ranks skip
  exactly that step, rank 0's scale follows a hand-computed history, rank 1 is never scaled.
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import init_gloo, run_distributed
from oracle import make_data, make_net, one_process_sgd
from torch import nn

from hetero_strategy.config import ConfigError, PrecisionConfig
from hetero_strategy.precision import DeviceInfo, RankPrecision, resolve_dtype

SIZES, STEPS = [3, 13], 20


def _train_each(rank: int, world: int, policy: list[str], methods: list[str], inject_at: int | None = None,
                steps: int = STEPS) -> dict:
    """{method: _train(...)} in one pair of processes (one spawn, one process group, runs in turn)."""
    init_gloo(rank, world)
    return {m: _train(rank, world, policy, m, inject_at, steps) for m in methods}


def _train(rank: int, world: int, policy: list[str], method: str, inject_at: int | None = None,
           steps: int = STEPS) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.hooks import build_comm_hook

    x, y = make_data(sum(SIZES) * steps).tensors
    model = DistributedDataParallel(make_net())
    fields = {"topk": dict(dense_fallback=False, base_density=0.3, min_density=0.3, dense_warmup_steps=2),
              "onebit": dict(dense_warmup_steps=2)}.get(method, {})
    state, hook = build_comm_hook(HeteroConfig.from_flat(compression=method, **fields), None, max_steps=steps)
    model.register_comm_hook(state, hook)
    cfg = PrecisionConfig(precision_policy=policy, init_scale=256.0, growth_interval=3)
    rp = RankPrecision.build(cfg, rank, world, torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g, start, stepped = sum(SIZES), sum(SIZES[:rank]), []
    for s in range(steps):
        idx = slice(s * g + start, s * g + start + SIZES[rank])
        state.set_local_batch(SIZES[rank], g)
        state.set_loss_scale(rp.scaler.scale)
        with rp.autocast():
            out = model(x[idx]).squeeze(1)
        loss = nn.functional.mse_loss(out.float(), y[idx])
        if s == inject_at and rank == 1:
            loss = loss * float("inf")
        rp.scaler.scale_loss(loss).backward()
        stepped.append(rp.scaler.step(opt))
        opt.zero_grad()
    return {"weights": [p.detach().clone() for p in model.parameters()], "history": list(rp.scaler.history),
            "stepped": stepped, "dtype": rp.dtype}


def _one_process(skip: set[int], steps: int) -> nn.Module:
    """fp32 SGD on the global batch, skipping the given steps (the oracle for the inf case)."""
    net = make_net()
    x, y = make_data(sum(SIZES) * steps).tensors
    opt, g = torch.optim.SGD(net.parameters(), lr=0.1), sum(SIZES)
    for s in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(net(x[s * g:(s + 1) * g]).squeeze(1), y[s * g:(s + 1) * g]).backward()
        if s not in skip:
            opt.step()
    return net


METHODS = ["none", "topk", "onebit", "fp16", "powersgd"]


@pytest.fixture(scope="module")
def bf16_beside_fp32():
    return run_distributed(_train_each, 2, ["bf16", "fp32"], METHODS, timeout=300)


@pytest.fixture(scope="module")
def fp32_pair():
    return run_distributed(_train_each, 2, ["fp32", "fp32"], METHODS[1:], timeout=300)


@pytest.mark.parametrize("method", METHODS)
def test_bf16_beside_fp32_stays_in_sync_and_near_fp32(method, bf16_beside_fp32, fp32_pair):
    ranks = [r[method] for r in bf16_beside_fp32]
    assert [r["dtype"] for r in ranks] == ["bf16", "fp32"]
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):
        assert torch.equal(a, b), "ranks must hold bitwise-identical weights"
    if method == "none":
        want = list(one_process_sgd(make_data(sum(SIZES) * STEPS), global_batch=16, steps=STEPS).parameters())
    else:  # the same compressed exchange with both ranks in fp32
        want = fp32_pair[0][method]["weights"]
    for got, ref in zip(ranks[0]["weights"], want):
        torch.testing.assert_close(got, ref.detach(), rtol=2e-2, atol=2e-2)  # bf16 keeps 8 mantissa bits
    assert all(h == 1.0 for r in ranks for h in r["history"])  # bf16 and fp32 are never scaled


@pytest.fixture(scope="module")
def inf_runs():
    return run_distributed(_train_each, 2, ["fp16", "fp32"], ["none", "topk"], 7, 12, timeout=300)


@pytest.mark.parametrize("method", ["none", "topk"])
def test_an_inf_on_the_fp32_rank_skips_the_step_everywhere_and_backs_off_the_fp16_scale(method, inf_runs):
    ranks = [r[method] for r in inf_runs]
    for r in ranks:
        assert [i for i, ok in enumerate(r["stepped"]) if not ok] == [7]
    # 256, grows x2 after 3 clean steps (steps 2 and 5), halves at the inf (step 7), grows at 10
    assert ranks[0]["history"] == [256, 256, 512, 512, 512, 1024, 1024, 512, 512, 512, 1024, 1024]
    assert ranks[1]["history"] == [1.0] * 12
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):
        assert torch.equal(a, b)
    if method == "none":
        for got, ref in zip(ranks[0]["weights"], _one_process({7}, 12).parameters()):
            torch.testing.assert_close(got, ref.detach(), rtol=5e-3, atol=5e-3)  # fp16: 11 mantissa bits


@pytest.mark.parametrize("capability, want", [((6, 1), "fp32"), ((7, 0), "fp16"), ((7, 5), "fp16"),
                                              ((8, 0), "bf16"), ((8, 6), "bf16"), ((9, 0), "bf16")])
def test_auto_picks_the_documented_dtype(capability, want):
    assert resolve_dtype("auto", 0, 1, DeviceInfo("cuda", "some GPU", capability)) == want


def test_names_lists_mappings_and_cpu():
    v100, a100 = DeviceInfo("cuda", "Tesla V100-SXM2", (7, 0)), DeviceInfo("cuda", "NVIDIA A100", (8, 0))
    assert resolve_dtype("auto", 0, 1, DeviceInfo("cpu", "cpu")) == "fp32"
    assert resolve_dtype("fp16", 0, 1, a100) == "fp16"
    assert resolve_dtype(["bf16", "fp32"], 1, 2, a100) == "fp32"
    mapping = {"V100": "fp32", "8.0": "fp16", "default": "bf16"}
    assert resolve_dtype(mapping, 0, 1, v100) == "fp32"  # by name
    assert resolve_dtype(mapping, 0, 1, a100) == "fp16"  # by capability
    assert resolve_dtype(mapping, 0, 1, DeviceInfo("cuda", "H100", (9, 0))) == "bf16"  # default
    assert resolve_dtype({"T4": "fp16"}, 0, 1, a100) == "bf16"  # no match, no default: auto
    with pytest.raises(ConfigError, match="2 entries for 3 ranks"):
        resolve_dtype(["bf16", "fp32"], 0, 3, a100)


@pytest.mark.parametrize("name, capability, want, why", [
    ("NVIDIA A100-SXM4-80GB", (8, 0), "fp32", "'A100'"),  # a name part wins over the capability
    ("NVIDIA A10", (8, 6), "fp16", "'A10'"),               # "A10" is not a part of "A100"
    ("NVIDIA L40S", (8, 9), "bf16", "'default'"),          # nor "L4" of "L40S"
    ("NVIDIA GeForce RTX 3090", (8, 6), "fp16", "'RTX 3090'"),  # two words in a row
    ("NVIDIA GeForce RTX 3080", (8, 6), "bf16", "'8.6'"),  # YAML's unquoted 8.6, a float key
    ("Tesla V100-SXM2-16GB", (7, 0), "fp16", "'7.0'"),
])
def test_mapping_keys_match_whole_words_most_specific_first(name, capability, want, why):
    import yaml

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.precision.policy import choose_dtype

    text = "precision: {precision_policy: {7.0: fp16, 8.6: bf16, A100: fp32, 8.0: bf16, A10: fp16, L4: fp16, " \
           "RTX 3090: fp16, default: bf16}}"
    policy = HeteroConfig.from_dict(yaml.safe_load(text)).precision.precision_policy
    dtype, reason = choose_dtype(policy, 0, 1, DeviceInfo("cuda", name, capability))
    assert (dtype, reason) == (want, f"precision_policy key {why}")


def _build_on(rank: int, world: int, names: list[str]) -> str:
    init_gloo(rank, world)
    info = DeviceInfo("cuda", names[rank], (7, 0) if "V100" in names[rank] else (8, 0))
    try:
        return RankPrecision.build(PrecisionConfig(precision_policy={"Tesla": "fp32", "V100": "fp16"}), rank,
                                   world, torch.device("cpu"), info).dtype
    except ConfigError as e:
        return str(e)


def test_a_policy_one_rank_cannot_resolve_stops_every_rank():
    """Only rank 1's device matches two name parts: rank 0 must stop too (not wait for rank 1 at
    its next collective), pointed at the rank with the error."""
    a100, v100 = run_distributed(_build_on, 2, ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"], timeout=60)
    assert "keys ['Tesla', 'V100'] are ambiguous" in v100
    assert a100.startswith("precision_policy=") and "is invalid on rank(s) [1]" in a100


def test_two_name_parts_of_one_device_are_refused_as_ambiguous():
    a100 = DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", (8, 0))
    with pytest.raises(ConfigError, match=r"keys \['A100', 'SXM4'\] are ambiguous"):
        resolve_dtype({"A100": "bf16", "SXM4": "fp16"}, 0, 1, a100)
    assert resolve_dtype({"A100": "fp16", "A100 SXM4": "bf16"}, 0, 1, a100) == "bf16"  # the longer part


@pytest.mark.parametrize("bad, match", [
    (dict(precision_policy="fp8"), "precision_policy='fp8' is invalid"),
    (dict(precision_policy=["bf16", "int8"]), r"precision_policy\[1\]='int8' is invalid"),
    (dict(precision_policy={"V100": "half"}), "precision_policy.V100='half' is invalid"),
    (dict(precision_policy={7: "fp16"}), r"precision_policy key=7 is invalid: .*7\.0, not 7"),
    (dict(precision_policy={"8": "fp16"}), "precision_policy key='8' is invalid: a capability is major.minor"),
    (dict(precision_policy={"defualt": "fp16"}), "key='defualt' is invalid: did you mean 'default'"),
    (dict(precision_policy={7.0: "fp16", "7.0": "bf16"}), "two keys name the same capability"),
    (dict(precision_policy={"V100": "fp16", "v100 ": "bf16"}), "or device-name part; keep one"),
    (dict(precision_policy={7.95: "fp16"}), "precision_policy key=7.95 is invalid"),
    (dict(precision_policy={float("inf"): "fp16"}), "precision_policy key=inf is invalid"),
    (dict(backoff_factor=1.5), "backoff_factor=1.5 is invalid"),
    (dict(growth_interval=0), "growth_interval=0 is invalid"),
])
def test_bad_policies_are_refused_at_construction(bad, match):
    with pytest.raises(ConfigError, match=match):
        PrecisionConfig(**bad)


def test_the_keep_list_runs_in_fp32_under_autocast():
    rp = RankPrecision.build(PrecisionConfig(precision_policy="bf16"), 0, 1, torch.device("cpu"))
    net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    assert rp.keep_fp32(net) == 1
    with rp.autocast():
        hidden = net[0](torch.randn(2, 4))
        out = net(torch.randn(2, 4))
    assert hidden.dtype == torch.bfloat16 and out.dtype == torch.float32


def test_the_keep_list_survives_deepcopy_and_pickle():
    import copy
    import pickle

    rp = RankPrecision.build(PrecisionConfig(precision_policy="bf16"), 0, 1, torch.device("cpu"))
    net = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    rp.keep_fp32(net)
    twin = copy.deepcopy(net)
    with torch.no_grad():
        twin[1].weight.fill_(3.0)  # the copy must run its own weights, not the original's
    x = torch.randn(2, 4)
    with rp.autocast():
        a, b = net(x), twin(x)
    assert a.dtype == b.dtype == torch.float32 and not torch.allclose(a, b)
    again = pickle.loads(pickle.dumps(net))
    with rp.autocast():
        assert again(x).dtype == torch.float32


def test_a_scaler_whose_dtype_changed_starts_fresh():
    from hetero_strategy.precision import CoordinatedScaler

    fp16 = CoordinatedScaler(enabled=True, init_scale=1024.0)
    fp16.update(found_inf=True)  # 512
    bf16 = CoordinatedScaler(enabled=False)
    with pytest.warns(UserWarning, match="starts fresh"):
        bf16.load_state_dict(fp16.state_dict())
    assert bf16.scale == 1.0 and bf16.scale_loss(torch.tensor(2.0)).item() == 2.0
    again = CoordinatedScaler(enabled=True, init_scale=1024.0)
    again.load_state_dict(fp16.state_dict())
    assert again.scale == 512.0
