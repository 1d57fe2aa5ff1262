"""precision_policy through Lightning's HeteroStrategy (2 gloo ranks, bf16 beside fp32) and the
refusals of a conflicting framework precision, in Lightning and Accelerate."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, loader, make_data, one_process_sgd, trainer_kwargs

from hetero_strategy import ConfigError

POLICIES = [["bf16", "fp32"], ["fp16", "fp32"]]


def _fit_all(rank: int, world: int) -> list[dict]:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    out = []
    for policy in POLICIES:  # one launch for both (each rank's start-up is most of the time)
        model = Regressor()
        # a small first scale: 2^16 overflows this model's fp16 gradients (then steps are skipped)
        strategy = HeteroStrategy(batch_sizes=[3, 13], precision_policy=policy, init_scale=256.0)
        trainer = L.Trainer(strategy=strategy, max_steps=20, **trainer_kwargs())
        trainer.fit(model, loader(make_data(320), batch_size=8))
        rp = strategy.runtime.precision
        out.append({"weights": [p.detach().clone() for p in model.net.parameters()], "dtype": rp.dtype,
                    "history": list(rp.scaler.history)})
    return out


@pytest.fixture(scope="module")
def fits():
    return run_distributed(_fit_all, 2, timeout=240)


@pytest.mark.parametrize("index", range(len(POLICIES)), ids=["-".join(p) for p in POLICIES])
def test_lightning_mixed_dtypes_stay_in_sync_and_near_fp32(fits, index):
    policy, ranks = POLICIES[index], [fits[0][index], fits[1][index]]
    assert [r["dtype"] for r in ranks] == policy
    assert len(ranks[0]["history"]) == 20  # every optimizer step went through the coordinated step
    scaled = 256.0 if policy[0] == "fp16" else 1.0  # only the fp16 rank scales (no overflow at 256)
    assert ranks[0]["history"] == [scaled] * 20 and ranks[1]["history"] == [1.0] * 20
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):
        assert torch.equal(a, b)
    want = one_process_sgd(make_data(320), global_batch=16, steps=20)
    for got, ref in zip(ranks[0]["weights"], want.parameters()):
        torch.testing.assert_close(got, ref.detach(), rtol=2e-2, atol=2e-2)


def test_lightning_refuses_a_conflicting_trainer_precision():
    import lightning as L

    from hetero_strategy import HeteroStrategy

    trainer = L.Trainer(strategy=HeteroStrategy(batch_sizes=[8], precision_policy="auto"), precision="bf16-mixed",
                        max_steps=1, **trainer_kwargs(devices=1))
    with pytest.raises(ConfigError, match=r"Trainer\(precision='bf16-mixed'\) conflicts with precision_policy='auto'"):
        trainer.fit(Regressor(), loader(make_data(16), batch_size=8))


def test_accelerate_refuses_mixed_precision_beside_a_policy():
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    net = torch.nn.Linear(5, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    plugin = HeteroPlugin(batch_sizes=[8], precision_policy="bf16")
    with pytest.raises(ConfigError, match="mixed_precision='bf16' conflicts with precision_policy='bf16'"):
        plugin.prepare(accelerator, net, opt, loader(make_data(16), batch_size=8))


def _refit(rank: int, world: int) -> dict:
    """Two epochs in one fit against one epoch, then a second fit of the same Trainer to two."""
    import lightning as L

    from hetero_strategy import HeteroStrategy

    out = {}
    for name, epochs in (("straight", [2]), ("refit", [1, 2])):
        model = Regressor()
        strategy = HeteroStrategy(batch_sizes=[3, 13], precision_policy=["fp16", "fp32"], init_scale=256.0,
                                  growth_interval=3, compression="topk", dense_fallback=False, dense_warmup_steps=2,
                                  density_schedule="constant")  # the run length (8 or 16) sets no period
        trainer = L.Trainer(strategy=strategy, max_epochs=epochs[0], **trainer_kwargs())
        for n in epochs:
            trainer.fit_loop.max_epochs = n
            trainer.fit(model, loader(make_data(128), batch_size=8, shuffle=True))
        out[name] = {"weights": [p.detach().clone() for p in model.net.parameters()],
                     "history": list(strategy.runtime.precision.scaler.history), "steps": trainer.global_step,
                     "skipped": strategy.runtime.precision.scaler.skipped_steps,
                     "residuals": strategy.hook_state.state_dict()["residuals"]}
    # the same Trainer fitting another model: nothing of the first model's state carried over
    trainer.fit_loop.max_epochs = 3
    trainer.fit(Regressor(), loader(make_data(128), batch_size=8, shuffle=True))
    out["fresh_history"] = list(strategy.runtime.precision.scaler.history)
    # a second fit with a loader of another batch size: the new loader's plan, not the old one's
    split = HeteroStrategy(capacities=[1.0, 3.0])
    trainer = L.Trainer(strategy=split, max_epochs=1, **trainer_kwargs())
    for epochs, batch in ((1, 4), (2, 8)):
        trainer.fit_loop.max_epochs = epochs
        trainer.fit(model, loader(make_data(64), batch_size=batch))
    out["new_batch"] = split.runtime.sampler.batch_sizes
    return out


def test_a_second_fit_of_one_trainer_goes_on_with_the_scale_and_residuals():
    """Lightning keeps its loops across fits; hetero keeps its loss scale, residuals and schedule
    too, so 1 + 1 epochs train exactly as 2 (plain SGD: Lightning's rebuilt optimizer holds nothing).
    A new loader brings its own batch plan; another model starts afresh."""
    for rank in run_distributed(_refit, 2, timeout=240):
        straight, refit = rank["straight"], rank["refit"]
        assert straight["steps"] == refit["steps"] == 16
        # the second fit's 8 steps (a scaler's history is its own run's) go on from the first's scale
        assert refit["history"] == straight["history"][-8:] and refit["skipped"] == straight["skipped"]
        if straight["history"][0] != 1.0:  # the fp16 rank: the scale really moved
            assert len(set(straight["history"])) > 2
        for key, value in straight["residuals"].items():
            assert torch.equal(refit["residuals"][key], value)
        for a, b in zip(refit["weights"], straight["weights"]):
            assert torch.equal(a, b)
        assert rank["new_batch"] == [4, 12]  # batch_size=8 on each of 2 ranks, split 1 : 3
        assert rank["fresh_history"][0] == straight["history"][0]  # 256 again on the fp16 rank


def test_a_precision_plugin_beside_a_policy_is_refused_in_lightning_and_fabric():
    from lightning.fabric.plugins.precision import Precision as FabricPrecision
    from lightning.pytorch.plugins.precision import Precision

    from hetero_strategy import HeteroFabricStrategy, HeteroStrategy

    with pytest.raises(ConfigError, match=r"precision_plugin=.* is invalid with precision_policy='bf16'.*drop one"):
        HeteroStrategy(precision_policy="bf16", precision_plugin=Precision())
    with pytest.raises(ConfigError, match=r"precision=.* is invalid with precision_policy='bf16'.*drop one"):
        HeteroFabricStrategy(precision_policy="bf16", precision=FabricPrecision())
    assert HeteroStrategy(precision_plugin=Precision()).precision_plugin is not None  # no policy: the user's
