"""HeteroStrategy(state_dict_type="sharded"): Lightning's checkpoints as per-rank DCP shards.

The oracle of a resumed run is the same fit without the interruption, in the same launch: with
dropout (RNG state), momentum (optimizer state) and Top-K (per-rank residuals) all of it must
come back for the weights to match.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, make_data, trainer_kwargs
from torch.nn import functional as F
from torch.utils.data import DataLoader

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.runtime import HeteroRuntime
from hetero_strategy.runtime.sharded_io import ShardedWriter


class _Dropout(Regressor):
    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(len(x))
        return F.mse_loss(self.net(F.dropout(x, 0.3)).squeeze(1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _fit(tmp: str, max_steps: int, callbacks: list, ckpt_path: str | None = None) -> list[torch.Tensor]:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    torch.manual_seed(0)
    model = _Dropout()
    strategy = HeteroStrategy(batch_sizes=[6, 10], compression="topk", base_density=0.25, dense_warmup_steps=2,
                              dense_fallback=False, state_dict_type="sharded")
    trainer = L.Trainer(strategy=strategy, max_steps=max_steps, callbacks=callbacks,
                        **trainer_kwargs(enable_checkpointing=bool(callbacks), default_root_dir=tmp))
    # NOTE: a generator of its own: otherwise starting the loader's iterator draws from the global
    # RNG, at a different point in a resumed run than in an uninterrupted one
    data = DataLoader(make_data(96), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return [p.detach().clone() for p in model.net.parameters()]


def _scenarios(rank: int, world_size: int, tmp: str) -> dict:
    from lightning.pytorch.callbacks import ModelCheckpoint

    out: dict = {"uninterrupted": _fit(tmp, 8, [])}
    every3 = os.path.join(tmp, "every3")

    def every_3() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=every3, every_n_train_steps=3, save_top_k=-1, save_last=True)

    _fit(tmp, 5, [every_3()])  # saves at step 3, then "dies" after step 5
    out["after_first"] = sorted(os.listdir(every3))
    out["shard_files"] = sorted(os.listdir(os.path.join(every3, "epoch=0-step=3.ckpt")))
    out["resumed"] = _fit(tmp, 8, [every_3()], ckpt_path="last")  # what a restarted job runs
    out["after_resume"] = sorted(os.listdir(every3))

    # save_top_k=1: each new checkpoint replaces the one before, once it is committed
    best = ModelCheckpoint(dirpath=os.path.join(tmp, "best"), every_n_train_steps=1, save_top_k=1, monitor="step",
                           mode="max")
    _fit(tmp, 4, [best])
    out["kept"] = sorted(os.listdir(os.path.join(tmp, "best")))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_distributed(_scenarios, 2, str(tmp_path_factory.mktemp("sharded")), timeout=240)


def test_each_rank_writes_its_own_shard_and_nothing_partial_is_left(results):
    assert results[0]["after_first"] == ["epoch=0-step=3.ckpt", "last.ckpt"]
    assert results[0]["shard_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert results[0]["after_resume"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt", "last.ckpt"]


def test_a_run_resumed_from_last_ends_with_the_uninterrupted_weights(results):
    for r in results:
        for got, want in zip(r["resumed"], r["uninterrupted"], strict=True):
            assert torch.equal(got, want), (got - want).abs().max()


def test_save_top_k_keeps_only_the_newest(results):
    assert results[0]["kept"] == ["epoch=0-step=4.ckpt"]


def test_an_older_checkpoint_is_removed_only_after_the_new_one_is_committed(tmp_path, monkeypatch):
    """A hand-held write: the removal waits for the commit (rank 0's rename), not for the save call."""
    import torch.distributed.checkpoint as dcp

    pending: Future = Future()
    monkeypatch.setattr(dcp, "async_save", lambda *a, **k: pending)
    writer = ShardedWriter(HeteroRuntime(HeteroConfig(), 0, 1))
    final = tmp_path / "epoch=0-step=2.ckpt"
    writer.save({}, final)
    (tmp_path / "epoch=0-step=2.ckpt.partial").mkdir()  # what DCP would be writing
    seen: list[bool] = []
    writer.then(lambda: seen.append(final.is_dir()))
    assert seen == []  # still in flight: the old checkpoint stays
    pending.set_result(None)
    writer.wait()
    assert seen == [True] and not Path(str(final) + ".partial").exists()


def test_a_crashs_leftovers_are_settled_before_the_next_write(tmp_path):
    """Each state a crash can leave, built by hand: what is whole comes back, the rest goes."""
    from hetero_strategy.runtime.sharded_io import sweep

    def ckpt(name: str, whole: bool = True) -> Path:
        (tmp_path / name).mkdir()
        if whole:
            (tmp_path / name / ".metadata").write_bytes(b"m")
        return tmp_path / name

    ckpt("last.ckpt.replaced.partial")  # killed between the two renames of a name saved again
    ckpt("a.ckpt"), ckpt("a.ckpt.replaced.partial")  # killed after both renames
    ckpt("b.ckpt.partial")  # written completely, killed before the rename
    ckpt("c.ckpt.partial", whole=False)  # killed inside the write
    ckpt("d.ckpt.removed-1a2b3c4d.partial")  # killed while deleting
    sweep(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "b.ckpt", "last.ckpt"]


def test_a_bad_state_dict_type_is_refused_at_construction():
    from hetero_strategy import HeteroStrategy

    with pytest.raises(ConfigError, match=r"state_dict_type='dcp' is invalid: choose 'full' .* or 'sharded'"):
        HeteroStrategy(state_dict_type="dcp")
