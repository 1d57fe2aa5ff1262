"""HeteroFSDPStrategy (strategy="hetero_fsdp") on 2 and 3 gloo ranks against one process on the global batch."""

from __future__ import annotations

import os

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, error_of, loader, make_data, one_process_sgd, trainer_kwargs


class _SelfSharded(Regressor):
    """Shards itself in configure_model, as Lightning's ModelParallelStrategy asks: used as it is."""

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.net, mesh=self.device_mesh["data_parallel"])


def _full(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter whole (the shards gathered; collective)."""
    from torch.distributed.tensor import DTensor

    return [(p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for p in module.parameters()]


def _fit(strategy, steps: int, model=None, world: int = 2, batch: int = 4, **extra):
    import lightning as L

    model = model or Regressor()
    trainer = L.Trainer(strategy=strategy, max_steps=steps, **trainer_kwargs(devices=world, **extra))
    trainer.fit(model, loader(make_data(80), batch, shuffle=extra.pop("shuffle", False)))
    return model, trainer


def _two_ranks(rank: int, world_size: int, tmp: str) -> dict:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from hetero_strategy import HeteroFSDPStrategy
    from hetero_strategy.runtime.fsdp import fsdp_modules

    out: dict = {}
    model, trainer = _fit(HeteroFSDPStrategy(batch_sizes=[3, 5]), 8)
    out["plain"], out["plain_seen"] = _full(model), model.seen
    out["plain_units"] = len(fsdp_modules(model))

    model, _ = _fit(HeteroFSDPStrategy(batch_sizes=[3, 5], auto_wrap_policy=["Linear"]), 8)
    out["wrapped"], out["wrapped_units"] = _full(model), len(fsdp_modules(model))

    model, _ = _fit(HeteroFSDPStrategy(batch_sizes=[3, 5]), 8, model=_SelfSharded())
    out["self_sharded"], out["self_units"] = _full(model), len(fsdp_modules(model))

    # "hetero_fsdp" by name, batch sizes from the probe: any split keeps one-process semantics
    model, trainer = _fit("hetero_fsdp", 4)
    out["probe"], out["probe_sizes"] = _full(model), trainer.strategy.sampler.batch_sizes

    # bf16 parameters reduced in fp32: the probe's steps (no sync) must leave nothing for the first real
    # step; the oracle is the same run at the probed split without a probe
    probed, trainer = _fit(HeteroFSDPStrategy(precision_policy="bf16"), 3)
    sizes = trainer.strategy.sampler.batch_sizes
    unprobed, _ = _fit(HeteroFSDPStrategy(precision_policy="bf16", batch_sizes=sizes), 3)
    out["bf16_probed"], out["bf16_unprobed"] = _full(probed), _full(unprobed)

    # mid-epoch checkpoint (DCP directory) at step 4 of 10, resumed to 8: equal to 8 uninterrupted steps
    every4 = ModelCheckpoint(dirpath=os.path.join(tmp, "every4"), every_n_train_steps=4, save_top_k=-1)
    _fit(HeteroFSDPStrategy(batch_sizes=[5, 3]), 4, callbacks=[every4], enable_checkpointing=True)
    ckpt = os.path.join(tmp, "every4", "epoch=0-step=4.ckpt")
    out["ckpt_is_dir"] = os.path.isdir(ckpt)
    resumed = Regressor()
    trainer = L.Trainer(strategy=HeteroFSDPStrategy(batch_sizes=[5, 3]), max_steps=8, **trainer_kwargs())
    trainer.fit(resumed, loader(make_data(80), 4), ckpt_path=ckpt)
    out["resumed"], out["resumed_seen"] = _full(resumed), resumed.seen

    out["wrong_class"] = error_of(lambda: _fit(HeteroFSDPStrategy(auto_wrap_policy=["Conv9d"]), 1))
    out["wrong_len"] = error_of(lambda: _fit(HeteroFSDPStrategy(batch_sizes=[3, 5, 1]), 1))
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return run_distributed(_two_ranks, 2, str(tmp_path_factory.mktemp("fsdp")), timeout=300)


def _close(got: list[torch.Tensor], want: torch.nn.Module) -> None:
    for g, w in zip(got, want.parameters(), strict=True):
        torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=0)


def test_unequal_batches_equal_one_process_on_the_global_batch(two):
    oracle = one_process_sgd(make_data(80), 8, 8)
    for r, sizes in zip(two, ([3] * 8, [5] * 8)):
        assert r["plain_seen"] == sizes
        for key in ("plain", "wrapped", "self_sharded"):
            _close(r[key], oracle)


def test_the_strategy_shards_an_unsharded_model_and_keeps_a_sharded_one(two):
    r = two[0]
    assert r["plain_units"] == 1  # the LightningModule's one child, net
    assert r["wrapped_units"] == 3  # each Linear, then net
    assert r["self_units"] == 1  # configure_model's own fully_shard(net), nothing added


def test_probed_split_sums_to_the_global_batch_and_stays_exact(two):
    sizes = two[0]["probe_sizes"]
    assert sum(sizes) == 8 and all(s > 0 for s in sizes) and two[1]["probe_sizes"] == sizes
    _close(two[0]["probe"], one_process_sgd(make_data(80), 8, 4))


def test_the_probe_leaves_no_gradient_behind_with_bf16_parameters(two):
    for got, want in zip(two[0]["bf16_probed"], two[0]["bf16_unprobed"], strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_resume_from_a_mid_epoch_dcp_checkpoint_goes_on_exactly(two):
    r0, r1 = two
    assert r0["ckpt_is_dir"]
    assert r0["resumed_seen"] == [5] * 4 and r1["resumed_seen"] == [3] * 4  # steps 5..8 only
    _close(r0["resumed"], one_process_sgd(make_data(80), 8, 8))


def test_bad_input_is_refused_naming_the_field(two):
    for r in two:
        assert "auto_wrap_policy=['Conv9d'] is invalid: the model has no module of class ['Conv9d']" in r["wrong_class"]
        assert "batch_sizes=[3, 5, 1] is invalid" in r["wrong_len"]


@pytest.mark.parametrize("field, value, words", [
    ("compression", "topk", "DDP comm hooks do not run on FSDP's reduce-scatter"),
    ("mode", "hybrid", "local-SGD phases need a whole model per rank"),
    ("precision_policy", ["bf16", "fp16"], "the shards of one parameter must share a dtype"),
    ("precision_policy", "auto", "the shards of one parameter must share a dtype"),
    ("ddp_comm_hook", print, "unknown option"),
])
def test_what_fsdp2_cannot_do_is_refused_at_construction(field, value, words):
    from hetero_strategy import ConfigError, HeteroFSDPStrategy

    with pytest.raises(ConfigError, match=f"^{field}=") as e:
        HeteroFSDPStrategy(**{field: value})
    assert words in str(e.value)


def _three_ranks(rank: int, world_size: int) -> list[torch.Tensor]:
    from hetero_strategy import HeteroFSDPStrategy

    # NOTE: 2/3/4, not the 2/3/5: per-rank sizes sum to the loader's batch_size x world size
    model, _ = _fit(HeteroFSDPStrategy(batch_sizes=[2, 3, 4], auto_wrap_policy=["Linear"]), 8, world=3, batch=3)
    return _full(model)


def test_three_ranks_of_unequal_batches_equal_one_process():
    for got in run_distributed(_three_ranks, 3, timeout=180):
        _close(got, one_process_sgd(make_data(80), 9, 8))
