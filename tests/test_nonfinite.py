"""nonfinite="skip" | "stop" under Lightning (2 gloo ranks): a NaN in rank 1's loss at step 2.

Oracles: the one-process run that drops step 2 (skip, dense); the weights before the NaN step
(skip, Top-K: a dropped step changes nothing); the injected rank and step (stop).
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, loader, make_data, one_process_sgd, trainer_kwargs

NAN_STEP = 2
TOPK = dict(compression="topk", dense_warmup_steps=1, base_density=0.3, dense_fallback=False)


def _fit_all(rank: int, world_size: int) -> dict:
    import lightning as L

    from hetero_strategy import HeteroStrategy
    from hetero_strategy.runtime import NonFiniteError

    class NanOnRank1(Regressor):
        """Rank 1's loss is NaN at NAN_STEP; the weights are kept after every step."""

        def __init__(self) -> None:
            super().__init__()
            self.after: list[list[torch.Tensor]] = []

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            if self.trainer.global_rank == 1 and self.trainer.global_step == NAN_STEP:
                loss = loss * float("nan")
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.after.append([p.detach().clone() for p in self.net.parameters()])

    out = {}
    for name, extra in {"skip": {}, "skip_topk": TOPK, "stop": dict(nonfinite="stop")}.items():
        model = NanOnRank1()
        strategy = HeteroStrategy(batch_sizes=[3, 13], **extra)
        trainer = L.Trainer(strategy=strategy, max_steps=5, **trainer_kwargs())
        try:
            trainer.fit(model, loader(make_data(80), batch_size=8, shuffle=True))
        except NonFiniteError as e:
            out[name] = {"error": str(e)}
            continue
        hook = strategy.hook_state
        out[name] = {"after": model.after, "skipped": strategy.runtime.gate.guard.skipped,
                     "residuals": {k: v.clone() for k, v in hook.state_dict().get("residuals", {}).items()}}
    return out


@pytest.fixture(scope="module")
def results():
    return run_distributed(_fit_all, 2, timeout=240)


def test_skip_drops_the_step_on_every_rank_like_one_process(results):
    oracle = one_process_sgd(make_data(80), 16, 5, shuffle=True, skip=frozenset({NAN_STEP}))
    for rank in range(2):
        run = results[rank]["skip"]
        assert run["skipped"] == 1
        for got, want in zip(run["after"][-1], oracle.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(results[0]["skip"]["after"][-1], results[1]["skip"]["after"][-1]):
        assert torch.equal(a, b)
    # the dropped step really mattered: applying it (NaN) or not dropping anything differs
    plain = one_process_sgd(make_data(80), 16, 5, shuffle=True)
    assert not all(torch.allclose(a, b.detach()) for a, b in zip(results[0]["skip"]["after"][-1], plain.parameters()))


def test_skip_with_topk_leaves_the_weights_and_residuals_finite_and_in_sync(results):
    for rank in range(2):
        run = results[rank]["skip_topk"]
        assert run["skipped"] == 1
        before, at = run["after"][NAN_STEP - 1], run["after"][NAN_STEP]
        assert all(torch.equal(a, b) for a, b in zip(before, at)), "the NaN step changed the weights"
        assert not all(torch.equal(a, b) for a, b in zip(at, run["after"][NAN_STEP + 1])), "training stopped"
        assert run["residuals"] and all(torch.isfinite(r).all() for r in run["residuals"].values())
    for a, b in zip(results[0]["skip_topk"]["after"][-1], results[1]["skip_topk"]["after"][-1]):
        assert torch.equal(a, b)
    # each rank keeps its own residual (the NaN rank's was not replaced by garbage or zeros)
    r0, r1 = results[0]["skip_topk"]["residuals"], results[1]["skip_topk"]["residuals"]
    assert any(not torch.equal(r0[k], r1[k]) for k in r0)


def test_stop_names_the_step_and_the_rank_on_every_rank(results):
    for rank in range(2):
        message = results[rank]["stop"].get("error")
        assert message is not None, f"rank {rank} did not stop"
        assert f"step {NAN_STEP}" in message and "rank(s) 1" in message and "nonfinite='skip'" in message
