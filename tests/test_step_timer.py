"""StepTimer's bookkeeping of a rank's own work after its last gradient, on fake clocks (wall and
CPU seconds set by hand: the expected figures are worked out from them, not from the timer)."""

from __future__ import annotations

import math
import types

import pytest

from hetero_strategy.runtime import timer as timer_module
from hetero_strategy.runtime.timer import StepTimer


@pytest.fixture
def clocks(monkeypatch):
    now = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(timer_module, "time", types.SimpleNamespace(perf_counter=lambda: now["wall"],
                                                                    process_time=lambda: now["cpu"]))
    monkeypatch.setattr(timer_module.torch, "get_num_threads", lambda: 1)  # as under torchrun: one per rank
    return now


def _advance(now, wall, cpu):
    now["wall"] += wall
    now["cpu"] += cpu


def _pass(t, clocks, compute, to_close, hook_state=None):
    """One pass: ``compute`` (wall, CPU) seconds to its last gradient, where the hook notes the
    clocks (or ``hook_state`` is handed over instead), then ``to_close`` (wall, CPU) until the
    batch is closed."""
    t.batch_start()
    _advance(clocks, *compute)
    hook = types.SimpleNamespace(last_hook_time=clocks["wall"], last_hook_cpu=clocks["cpu"])
    _advance(clocks, *to_close)
    t.backward_end(hook_state or hook)


def test_work_after_the_last_gradient_at_the_computes_pace(clocks):
    # compute: 0.4 s of wall on 0.2 CPU s (half a core); after the last gradient 0.5 s of wall
    # (mostly waiting) holding 0.05 CPU s (the exchange's tail, the optimizer)
    t = StepTimer()
    _pass(t, clocks, (0.4, 0.2), (0.3, 0.02))
    _advance(clocks, 0.2, 0.03)
    t.step_end()
    assert t.compute_time == pytest.approx(0.4)
    assert t.after_cpu == pytest.approx(0.05) and t.pace == pytest.approx(2.0)
    assert t.after_backward == pytest.approx(0.1)


def test_accumulation_counts_every_pass_and_the_last_ones_hook(clocks):
    # two passes: the first under no_sync (no hook; the state still holds the previous step's
    # times), the second syncs. Compute 0.2 + 0.3 s of wall on 0.1 + 0.15 CPU s.
    stale = types.SimpleNamespace(last_hook_time=clocks["wall"] - 1.0, last_hook_cpu=clocks["cpu"] - 1.0)
    t = StepTimer()
    _pass(t, clocks, (0.2, 0.1), (0.0, 0.0), hook_state=stale)
    _pass(t, clocks, (0.3, 0.15), (0.1, 0.01))
    _advance(clocks, 0.1, 0.03)
    t.step_end()
    assert t.compute_time == pytest.approx(0.5)
    assert t.pace == pytest.approx(0.5 / 0.25) and t.after_cpu == pytest.approx(0.04)


@pytest.mark.parametrize("case", ["no hook", "stale hook", "gpu bucket", "threads", "no compute CPU"])
def test_nothing_measured_is_nan(clocks, monkeypatch, case):
    t = StepTimer()
    if case == "threads":
        monkeypatch.setattr(timer_module.torch, "get_num_threads", lambda: 4)
    t.batch_start()
    _advance(clocks, 0.4, 0.0 if case == "no compute CPU" else 0.2)
    hook = types.SimpleNamespace(last_hook_time=clocks["wall"] - (10.0 if case == "stale hook" else 0.0),
                                 last_hook_cpu=None if case == "gpu bucket" else clocks["cpu"])
    _advance(clocks, 0.2, 0.05)
    t.backward_end(None if case == "no hook" else hook)
    t.step_end()
    assert math.isnan(t.after_cpu) and math.isnan(t.pace) and math.isnan(t.after_backward)
