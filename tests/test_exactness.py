"""Semantics 1-3: hetero steps equal one-process SGD with the global batch (Lightning, 2 gloo ranks)."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, loader, make_data, one_process_sgd, trainer_kwargs

SCENARIOS = {
    # name: (n samples, shuffle, drop_last, max_steps, accumulate, clip)
    "plain": (80, False, False, 5, 1, None),
    "deferred_comm_many_buckets": (70, True, False, 5, 1, None),
    "overlapped_comm_many_buckets": (70, True, False, 5, 1, None),
    "copied_grads": (80, False, False, 5, 1, None),
    "shuffle_uneven_last": (70, True, False, 5, 1, None),
    "two_epochs_shuffled": (40, True, False, 6, 1, None),
    "accumulate_clip": (96, True, True, 3, 2, 0.05),
}


def _fit_all(rank: int, world_size: int) -> dict:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    out = {}
    for name, (n, shuffle, drop_last, steps, accumulate, clip) in SCENARIOS.items():
        model = Regressor()
        # One bucket per parameter, all sent after backward (the hook's deferred path) or each as
        # soon as it is ready (overlapped, also the default). copied_grads turns
        # off hetero's default gradient_as_bucket_view (DDP's own default).
        extra = {
            "deferred_comm_many_buckets": dict(overlap_comm=False, bucket_cap_mb=1e-5),
            "overlapped_comm_many_buckets": dict(overlap_comm=True, bucket_cap_mb=1e-5),
            "copied_grads": dict(gradient_as_bucket_view=False),
        }.get(name, {})
        trainer = L.Trainer(
            strategy=HeteroStrategy(batch_sizes=[3, 13], **extra), max_steps=steps, accumulate_grad_batches=accumulate,
            gradient_clip_val=clip, **trainer_kwargs(),
        )
        trainer.fit(model, loader(make_data(n), batch_size=8, shuffle=shuffle, drop_last=drop_last))
        out[name] = {"seen": list(model.seen), "weights": [p.detach().clone() for p in model.net.parameters()]}
    return out


@pytest.fixture(scope="module")
def results():
    return run_distributed(_fit_all, 2, timeout=240)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_weights_match_one_process(results, name):
    n, shuffle, _drop_last, steps, accumulate, clip = SCENARIOS[name]
    oracle = one_process_sgd(make_data(n), 16, steps, shuffle=shuffle, accumulate=accumulate, clip=clip)
    for rank in range(2):
        for got, want in zip(results[rank][name]["weights"], oracle.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ranks_hold_identical_weights(results, name):
    for a, b in zip(results[0][name]["weights"], results[1][name]["weights"]):
        assert torch.equal(a, b)


def test_batch_sizes_seen(results):
    assert results[0]["plain"]["seen"] == [3] * 5
    assert results[1]["plain"]["seen"] == [13] * 5
    # 70 samples, G=16: four full steps, then 6 samples split 3:13 -> 1 and 5.
    assert results[0]["shuffle_uneven_last"]["seen"] == [3, 3, 3, 3, 1]
    assert results[1]["shuffle_uneven_last"]["seen"] == [13, 13, 13, 13, 5]
    # 40 samples: 16, 16, 8 (split 2:6) per epoch, same number of steps on both ranks.
    assert results[0]["two_epochs_shuffled"]["seen"] == [3, 3, 2] * 2
    assert results[1]["two_epochs_shuffled"]["seen"] == [13, 13, 6] * 2
