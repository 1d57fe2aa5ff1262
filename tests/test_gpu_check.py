"""benchmarks/gpu_check.py keeps working without a GPU: its CPU run covers every section but kernels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_cpu_and_reports_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu",
                           "--json", str(out)], check=False, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["kernels"]["skipped"].startswith("no CUDA")
    hooks = report["hooks"]["hooks"]
    assert set(hooks) >= {"none", "fp16", "bf16", "powersgd", "topk", "tiered", "onebit", "topk_pipelined"}
    assert all(row["finite"] for row in hooks.values())
    assert hooks["none"]["equals_plain"] and hooks["topk_density_1"]["equals_plain"]
    assert all(hooks[f"{name}_side"]["equals_plain_path"] for name in ("topk", "topk_pipelined", "onebit"))
    assert report["hooks"]["problems"] == [] and report["overlap"]["skipped"].startswith("no CUDA")
    assert report["autocast"]["bf16"]["logits_dtype"] == "torch.bfloat16"
    assert report["autocast"]["fp16"]["scale"] == 2.0**16 and report["autocast"]["fp16"]["stepped"]
