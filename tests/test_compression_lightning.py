"""The compression hooks through HeteroStrategy (2 gloo ranks, unequal batches): density 1.0 equals
one-process SGD with the global batch; a sparse run keeps ranks identical and counts its bytes;
an epoch-bounded run takes its schedule period from Lightning's step estimate."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, loader, make_data, one_process_sgd, trainer_kwargs


def _fit(rank: int, world_size: int) -> dict:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    out = {}
    for name, extra in {
        "density_one": dict(compression="topk", base_density=1.0, min_density=1.0, dense_warmup_steps=1),
        "sparse": dict(compression="tiered", dense_fallback=False, tiers=["ib", "eth1g"], base_density=0.5,
                       min_density=0.1, dense_warmup_steps=1),
        "by_epochs": dict(compression="topk", dense_fallback=False, base_density=0.5, min_density=0.1,
                          dense_warmup_steps=1),
    }.items():
        model = Regressor()
        strategy = HeteroStrategy(batch_sizes=[3, 13], **extra)
        length = dict(max_epochs=1) if name == "by_epochs" else dict(max_steps=5)
        trainer = L.Trainer(strategy=strategy, **length, **trainer_kwargs())
        trainer.fit(model, loader(make_data(80), batch_size=8))
        state = strategy.hook_state
        out[name] = {"weights": [p.detach().clone() for p in model.net.parameters()], "step": state.step,
                     "bytes": state.total_bytes_sent, "tiers": state.tiers,
                     "residuals": state.state_dict()["residuals"], "period": state.schedule.period,
                     "metrics": state.metrics()}
    return out


def test_hetero_strategy_with_compression() -> None:
    ranks = run_distributed(_fit, 2, timeout=240)
    want = one_process_sgd(make_data(80), global_batch=16, steps=5)
    for got, ref in zip(ranks[0]["density_one"]["weights"], want.parameters()):
        torch.testing.assert_close(got, ref.detach(), rtol=1e-5, atol=1e-6)
    for r in ranks:
        assert r["sparse"]["step"] == 5 and r["sparse"]["bytes"] > 0
        assert r["sparse"]["tiers"] == ["ib", "eth1g"]
        assert set(r["sparse"]["metrics"]) == {"comm/bytes_sent", "comm/bytes_received", "comm/density",
                                               "comm/dense_fallback", "comm/entries_sent", "comm/density_sent"}
        # exact selection sends what it plans
        assert r["sparse"]["metrics"]["comm/density_sent"] == pytest.approx(r["sparse"]["metrics"]["comm/density"])
        assert r["sparse"]["metrics"]["comm/dense_fallback"] == 0.0  # dense_fallback=False
        # density 1 with the default dense_fallback on loopback: every entry sent whole, and said so
        assert r["density_one"]["metrics"]["comm/dense_fallback"] == 1.0
    for a, b in zip(ranks[0]["sparse"]["weights"], ranks[1]["sparse"]["weights"]):
        assert torch.equal(a, b), "ranks must hold identical weights"
    assert any(v.abs().sum() > 0 for v in ranks[1]["sparse"]["residuals"].values())
    # without max_steps the cosine period is the run's length: 80 samples / 16 per step, 1 epoch
    assert ranks[0]["by_epochs"]["period"] == 5 and ranks[0]["by_epochs"]["step"] == 5


def _fit_auto(rank: int, world_size: int) -> dict:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    model = Regressor()
    strategy = HeteroStrategy(batch_sizes=[3, 13], compression="auto")
    trainer = L.Trainer(strategy=strategy, max_steps=5, **trainer_kwargs())
    trainer.fit(model, loader(make_data(80), batch_size=8))
    return {"weights": [p.detach().clone() for p in model.net.parameters()],
            "decision": strategy.hook_state.state_dict()["auto"], "predicted": strategy.hook_state.auto_predicted_ms}


def test_auto_through_lightning_decides_alike_and_stays_sample_weighted() -> None:
    """Loopback is fast: auto keeps a dense codec (fp32 or fp16); batches 3/13 are weighted b_r/G
    (a 1/W mean would move the weights by far more than fp16's rounding)."""
    ranks = run_distributed(_fit_auto, 2, timeout=240)
    assert ranks[0]["decision"] == ranks[1]["decision"] and ranks[0]["decision"]["codec"] in ("dense", "fp16")
    assert ranks[0]["predicted"] == ranks[0]["decision"]["predicted_ms"] > 0
    want = one_process_sgd(make_data(80), global_batch=16, steps=5)
    for got, ref in zip(ranks[0]["weights"], want.parameters()):
        torch.testing.assert_close(got, ref.detach(), rtol=2e-3, atol=2e-3)
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):
        assert torch.equal(a, b)
