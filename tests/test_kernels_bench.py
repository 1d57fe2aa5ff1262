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
    # thresh+nonzero keeps |x| >= the ceil(k / 100)-th largest of a 1-in-100 strided sample; on this
    # tie-free input it must select exactly the m largest, m = that sampled value's rank in the whole
    # input (found here by a full sort, not by the path's topk-and-compare)
    values, idx, residual = bench._threshold_nonzero_path(acc, k)
    thr = torch.sort(acc[::100].abs(), descending=True).values[0]  # ceil(40 / 100) = 1st sampled
    m = int((torch.sort(acc.abs(), descending=True).values == thr).nonzero()) + 1
    assert idx.numel() == m  # here 22, not k = 40: the sample only approximates k
    assert set(idx.tolist()) == set(torch.topk(acc.abs(), m).indices.tolist())
    assert torch.equal(values, acc[idx.long()]) and torch.equal(residual[idx.long()], torch.zeros(m))


@pytest.mark.parametrize(("k", "want"), [(40, 100), (250, 300), (1, 100), (2000, 2000)])
def test_threshold_nonzero_path_selects_a_hand_counted_set(bench, k, want):
    # |acc[i]| = (i + 1) / 2000, signs alternating: tie-free and increasing. The stride-100 sample
    # holds i = 0, 100, ..., 1900. k = 40 (or 1): ceil(k / 100) = 1, threshold |acc[1900]| -> i >= 1900,
    # 100 entries; k = 250: the 3rd largest sampled, |acc[1700]| -> i >= 1700, 300 entries; k = 2000:
    # the 20th, |acc[0]| -> all 2000.
    n = 2000
    acc = (torch.arange(n, dtype=torch.float32) + 1) / n * torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0)
    values, idx, residual = bench._threshold_nonzero_path(acc, k)
    assert idx.tolist() == list(range(n - want, n))
    assert torch.equal(values, acc[n - want:]) and int(torch.count_nonzero(residual)) == n - want


def test_triton_path_and_gpu_check_run_under_the_interpreter(bench):
    acc = torch.randn(300, generator=torch.Generator().manual_seed(1))
    paths = bench.make_paths(passes=3, with_triton=True)
    count = paths["triton"](acc, 7)[2]
    assert count.item() == 7
    bench.check_against_reference(acc, 7, passes=3)  # raises SystemExit on any difference
