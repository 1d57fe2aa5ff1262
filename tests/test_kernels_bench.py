"""benchmarks/bench_kernels.py: parses, runs its setup path on CPU, refuses clearly without CUDA.

Run: ``TRITON_INTERPRET=1 .venv/bin/python -m pytest -q tests/test_kernels_bench.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # NOTE: before the kernels are imported (decorated)

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_writes_a_complete_report(bench, tmp_path):
    out = tmp_path / "k.json"
    argv = ["--dry-run", "--sizes", "500", "--densities", "0.01,0.1", "--warmup", "1", "--iters", "2",
            "--json", str(out)]
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["peak_gbps"] > 0
    rows = report["results"]
    assert {(r["density"], r["path"]) for r in rows} == {
        (d, p) for d in (0.01, 0.1) for p in ("torch-ref", "torch.topk", "thresh+nonzero")
    }
    for r in rows:
        assert r["k"] == {0.01: 5, 0.1: 50}[r["density"]]
        assert r["median_ms"] > 0 and r["gbps"] > 0 and r["x_floor"] > 0 and r["speedup_vs_topk"] > 0


def test_without_cuda_it_says_so_and_fails(bench, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--sizes", "1e6"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_on_a_gpu_it_refuses_to_time_the_interpreter(bench, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert bench.main(["--sizes", "1e6"]) == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().err


def test_compared_paths_send_the_largest_entries(bench):
    acc = torch.randn(2000, generator=torch.Generator().manual_seed(0))
    k = 40
    true_top = set(torch.topk(acc.abs(), k).indices.tolist())
    values, idx, residual = bench._topk_path(acc, k)
    assert set(idx.tolist()) == true_top and torch.equal(values, acc[idx.long()])
    assert torch.equal(residual + torch.zeros_like(acc).index_put((idx.long(),), values), acc)
    values, idx, residual = bench._threshold_nonzero_path(acc, k)
    assert abs(idx.numel() - k) <= k  # a sampled threshold only approximates k
    assert set(idx.tolist()) >= true_top or set(idx.tolist()) <= true_top  # a threshold set is nested


def test_triton_path_and_gpu_check_run_under_the_interpreter(bench):
    acc = torch.randn(300, generator=torch.Generator().manual_seed(1))
    paths = bench.make_paths(passes=3, with_triton=True)
    count = paths["triton"](acc, 7)[2]
    assert count.item() == 7
    bench.check_against_reference(acc, 7, passes=3)  # raises SystemExit on any difference
