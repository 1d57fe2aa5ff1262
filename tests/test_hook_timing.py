"""The profile's per-codec hook timing (hooks/timing.py): what a step pays for each codec under DDP,
checked against a hook of known cost, on a single process (no default group before or after)."""

import time

import pytest
import torch
import torch.distributed as dist

from hetero_strategy.hooks import timing


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), torch.randn(8, 16)


def _loss(model, x):
    return model(x).square().mean()


def test_a_hook_of_known_cost_is_timed_as_its_cpu_time(monkeypatch):
    """Oracle: a hook that spins the CPU for 40 ms per bucket (one bucket here) costs a step 40 ms of
    CPU; the rest of DDP's work on a 700-parameter model is well under the tolerance. A hook that
    only waits (as on a link) costs no CPU: the link is the cost model's, not this figure's."""
    def busy(state, bucket):
        start = time.process_time()
        while time.process_time() - start < 0.04:
            pass
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def sleepy(state, bucket):
        time.sleep(0.04)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    from hetero_strategy.hooks import factory

    hooks = iter([busy, sleepy])
    monkeypatch.setattr(factory, "build_comm_hook", lambda cfg, group, max_steps=None: (None, next(hooks)))
    model, x = _mlp()
    got = timing.hook_seconds(model, x, _loss, ["dense", "fp16"], pairs=3)
    assert got["dense"] == pytest.approx(0.04, abs=0.015)
    assert got["fp16"] < 0.015
    assert not dist.is_initialized()  # the one-rank group it made is gone


def test_every_candidate_label_runs_its_real_hook():
    model, x = _mlp()
    labels = ["dense", "fp16", "powersgd rank 2", "topk_allreduce density 0.05", "topk density 0.01"]
    got = timing.hook_seconds(model, x, _loss, labels, pairs=1)
    assert set(got) == set(labels) and all(0.0 <= v < 1.0 for v in got.values())
    assert not dist.is_initialized()
    for p in model.parameters():  # the caller's model is untouched: each label ran on a copy
        assert p.grad is None


@pytest.mark.parametrize("label,method", [("dense", "none"), ("fp16", "fp16"), ("powersgd rank 8", "powersgd"),
                                          ("topk_allreduce density 0.01", "topk_allreduce"),
                                          ("topk density 0.05", "topk")])
def test_a_label_maps_to_its_method(label, method):
    cfg = timing.candidate_config(label).compression
    assert cfg.method == method
    if "density" in label:
        assert cfg.base_density == float(label.split()[-1]) and cfg.density_schedule == "constant"
        assert cfg.dense_fallback is False  # the codec's own work, whatever the link
    if "rank" in label:
        assert cfg.powersgd_rank == 8


def test_an_unknown_label_is_refused_by_name():
    with pytest.raises(ValueError, match="codec label 'lz4' is invalid"):
        timing.candidate_config("lz4")
