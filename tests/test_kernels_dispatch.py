"""Kernel dispatcher: torch for CPU tensors by default, Triton when forced under the interpreter.

Run: ``TRITON_INTERPRET=1 .venv/bin/python -m pytest -q tests/test_kernels_dispatch.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before the kernels are imported (decorated)

import subprocess
import sys

import pytest
import torch
from hetero_strategy.triton_kernels import dispatch
from hetero_strategy.triton_kernels import ef_accumulate as ef_mod
from hetero_strategy.triton_kernels import scatter_add as sa_mod
from hetero_strategy.triton_kernels import topk_select as ts_mod


@pytest.fixture(autouse=True)
def _clean_choice(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.set_backend(None)
    dispatch.reload_env()
    yield
    dispatch.set_backend(None)
    dispatch.reload_env()


def _setenv(monkeypatch, value: str) -> None:
    monkeypatch.setenv(dispatch.ENV_VAR, value)
    dispatch.reload_env()  # read once per process otherwise


@pytest.fixture
def triton_calls(monkeypatch):
    """Count calls that reach the Triton launchers (the torch references are left alone)."""
    calls = []
    for mod, name in ((ef_mod, "ef_accumulate"), (ts_mod, "topk_select"), (sa_mod, "scatter_add")):
        real = getattr(mod, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(mod, name, spy)
    return calls


def _pipeline(backend=None):
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(300, generator=g).to(torch.bfloat16)
    residual = torch.randn(300, generator=g)
    acc = dispatch.ef_accumulate(grad, residual, 0.9, backend=backend)
    values, indices, count, new_residual = dispatch.topk_select(acc, 30, 32, backend=backend)
    rows_v = torch.stack([values, values * 2])
    rows_i = torch.stack([indices, indices])
    out = dispatch.scatter_add(torch.zeros(300), rows_v, rows_i, torch.tensor([0.25, 0.5]), backend=backend)
    return acc, values, indices, count, new_residual, out


def test_cpu_tensors_use_torch_by_default(triton_calls):
    assert dispatch.backend_for(torch.zeros(3)) == "torch"
    _pipeline()
    assert triton_calls == []


@pytest.mark.parametrize("how", ["env", "setter", "argument"])
def test_forcing_triton_under_the_interpreter_runs_the_kernels(how, monkeypatch, triton_calls):
    expected = _pipeline(backend="torch")
    if how == "env":
        _setenv(monkeypatch, "triton")
    elif how == "setter":
        dispatch.set_backend("triton")
    got = _pipeline(backend="triton" if how == "argument" else None)
    assert triton_calls == ["ef_accumulate", "topk_select", "scatter_add"]
    for a, b in zip(got, expected):  # identical results across backends
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_interpreted_kernels_are_safe_from_several_threads():
    # DDP runs comm-hook callbacks off the autograd thread; the interpreter keeps global state.
    from concurrent.futures import ThreadPoolExecutor

    accs = [torch.randn(700, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda a: dispatch.topk_select(a, 50, 50, backend="triton"), accs))
    for acc, out in zip(accs, got):
        for a, b in zip(out, dispatch.topk_select(acc, 50, 50, backend="torch")):
            assert torch.equal(a, b)


def test_argument_beats_setter_beats_env_and_auto_defers(monkeypatch):
    t = torch.zeros(2)
    _setenv(monkeypatch, "triton")
    assert dispatch.backend_for(t) == "triton"
    assert dispatch.backend_for(t, backend="auto") == "triton"  # an "auto" argument defers to the env
    dispatch.set_backend("torch")
    assert dispatch.backend_for(t) == "torch"
    assert dispatch.backend_for(t, backend="triton") == "triton"
    dispatch.set_backend("auto")  # defers to the env as well
    assert dispatch.backend_for(t, backend="auto") == "triton"
    _setenv(monkeypatch, "auto")
    assert dispatch.backend_for(t, backend="auto") == "torch"  # all auto: CPU tensor -> torch


def test_the_environment_is_read_once(monkeypatch):
    t = torch.zeros(2)
    assert dispatch.backend_for(t) == "torch"
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")  # a change after the first call is not seen ...
    assert dispatch.backend_for(t) == "torch"
    dispatch.reload_env()  # ... until it is read again
    assert dispatch.backend_for(t) == "triton"


def test_forced_triton_on_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        dispatch.backend_for(torch.zeros(2), backend="triton")


def test_bad_backend_names_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="set_backend"):
        dispatch.set_backend("cuda")
    _setenv(monkeypatch, "fast")
    with pytest.raises(ValueError, match="HETERO_KERNELS: 'fast'.*auto, torch, triton"):
        dispatch.backend_for(torch.zeros(2))


def test_import_and_torch_path_work_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import torch, hetero_strategy\n"
        "from hetero_strategy.triton_kernels import dispatch\n"
        "assert not dispatch.triton_available() and dispatch.backend_for(torch.zeros(1)) == 'torch'\n"
        "v, i, c, r = dispatch.topk_select(torch.tensor([1.0, -3.0, 2.0]), 1, 2)\n"
        "assert i.tolist() == [1, 0] and c.item() == 1 and r.tolist() == [1.0, 0.0, 2.0]\n"
        "try:\n    dispatch.backend_for(torch.zeros(1), 'triton')\nexcept RuntimeError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Triton does not import" in proc.stdout


@pytest.mark.parametrize("name", ["", ".ef_accumulate", ".threshold", ".compact", ".topk_select", ".scatter_add",
                                  ".segments", ".threshold_select", ".dispatch"])
def test_docstring_examples_run(name):
    import doctest
    import importlib

    module = importlib.import_module("hetero_strategy.triton_kernels" + name)
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
