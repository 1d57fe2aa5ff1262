"""The package that ``pip install hetero-strategy`` gets: the sdist, the wheel built from it, and that
wheel installed into a fresh virtual environment, used from outside the checkout.

The wheel installs with ``--no-deps``; its dependencies (torch, Lightning, ...) come from this
project's venv through a ``.pth`` file holding that site-packages folder's path. A plain path line
in a ``.pth`` processes no ``.pth`` file inside that folder, so the checkout's editable-install
finder stays off: ``hetero_strategy`` can only come from the wheel, which the test asserts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from dist_utils import launch_env, run_command

ROOT = Path(__file__).resolve().parents[1]

# A 2-rank CPU fit, batches 3/13 of each global 16, Top-K forced on (the codec runs through
# hetero_strategy.triton_kernels.dispatch); the registry names are checked too.
_SMOKE = '''
import json
import sys

import lightning as L
import torch
from lightning.pytorch.strategies import StrategyRegistry
from torch.utils.data import DataLoader, TensorDataset

import hetero_strategy


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8, shuffle=True)
    assert {"hetero", "hetero_topk"} <= set(StrategyRegistry), list(StrategyRegistry)
    strategy = hetero_strategy.HeteroStrategy(batch_sizes=[3, 13], compression="topk",
                                              dense_fallback=False, dense_warmup_steps=1)
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_steps=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Tiny()
    trainer.fit(model, loader)
    ops = sorted(m for m in sys.modules if m.startswith("hetero_strategy.triton_kernels."))
    result = {"steps": trainer.global_step, "sizes": strategy.sampler.batch_sizes,
              "params": [p.detach().tolist() for p in model.parameters()],
              "files": [hetero_strategy.__file__] + [sys.modules[m].__file__ for m in ops]}
    with open(f"rank{trainer.global_rank}.json", "w") as f:
        json.dump(result, f)
'''


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build``'s sdist and wheel (the wheel built from the unpacked sdist, so the sdist is
    checked to carry all the wheel needs); no isolation: this venv's setuptools, no download."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "project.license as a TOML table is deprecated" not in proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh venv (no pip, no checkout on its path) holding only the wheel; deps through a .pth."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=60)
    python = env_dir / "bin" / "python"
    (wheel,) = dist.glob("*.whl")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-index", "--no-compile", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(purelib) / "_hetero_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return env_dir


def _fresh_env(venv: Path) -> dict[str, str]:
    """launch_env() (clean launch variables, a free port) with nothing that points at the checkout."""
    env = {k: v for k, v in launch_env().items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONNOUSERSITE="1", PATH=f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin")
    return env


def test_wheel_and_sdist_carry_the_package_and_nothing_else(dist):
    (wheel,) = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert {n.split("/")[0] for n in names} == {"hetero_strategy", info}, sorted({n.split("/")[0] for n in names})
    for required in ("hetero_strategy/__init__.py", "hetero_strategy/py.typed", "hetero_strategy/cli.py",
                     "hetero_strategy/triton_kernels/__init__.py", "hetero_strategy/triton_kernels/dispatch.py",
                     "hetero_strategy/transformers/__init__.py", "hetero_strategy/fabric/__init__.py",
                     "hetero_strategy/cluster/cards.yaml",  # hetero-strategy plan's card table
                     f"{info}/licenses/LICENSE"):
        assert required in names, required
    shipped = {f"hetero_strategy/triton_kernels/{p.name}" for p in (ROOT / "triton_kernels").glob("*.py")}
    assert shipped <= set(names), sorted(shipped - set(names))
    stray = [n for n in names if re.search(r"(^|/)(tests?|recipes|docs|benchmarks|hetero_bench)/|(^|/)test_|\.md$", n)]
    assert not stray, stray
    with zipfile.ZipFile(wheel) as z:
        assert re.search(r"^hetero-strategy = hetero_strategy\.cli:console$",
                         z.read(f"{info}/entry_points.txt").decode(), re.MULTILINE)
        metadata = z.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert re.search(r"^Requires-Dist: triton>=3\.0; platform_system == \"Linux\"", metadata, re.MULTILINE)
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = [m.split("/", 1)[1] for m in tar.getnames() if "/" in m]
        pyproject = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/pyproject.toml").read().decode()
    assert 'hetero-strategy = "hetero_strategy.cli:console"' in pyproject  # the entry point the wheel is built with
    assert "src/hetero_strategy/py.typed" in members and "triton_kernels/dispatch.py" in members
    assert "LICENSE" in members and "pyproject.toml" in members
    assert not [m for m in members if m.split("/")[0] in ("tests", "recipes", "docs", "benchmarks")]


@pytest.mark.slow
def test_fresh_venv_runs_the_cli_and_a_two_rank_fit(venv, tmp_path):
    bin_dir, env = venv / "bin", _fresh_env(venv)
    code = "import json, sys, hetero_strategy, hetero_strategy.triton_kernels as k;" \
           "print(json.dumps([hetero_strategy.__file__, k.__file__, sys.path]))"
    where = subprocess.run([str(bin_dir / "python"), "-c", code],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert where.returncode == 0, where.stderr[-4000:]
    package, kernels, path = json.loads(where.stdout)
    for file in (package, kernels):
        assert Path(file).resolve().is_relative_to(venv.resolve()), (file, venv)
    deps = Path(sysconfig.get_path("purelib")).resolve()  # this venv's, which may lie in the checkout (.venv/)
    in_checkout = [p for p in path if p and Path(p).resolve() != deps and Path(p).resolve().is_relative_to(ROOT)]
    assert not in_checkout and str(deps) in path, path

    rc, log = run_command([str(bin_dir / "hetero-strategy"), "--help"], env=env, cwd=tmp_path, timeout=60)
    assert rc == 0, log[-4000:]
    assert "usage: hetero-strategy" in log and "bench" in log and "emulate" in log
    # the benchmarks are checkout-only (issue 15): the installed command says so in one line, no traceback
    rc, log = run_command([str(bin_dir / "hetero-strategy"), "bench", "compression", "--json", "x.json"],
                          env=env, cwd=tmp_path, timeout=60)
    assert rc == 2 and "Traceback" not in log and "checkout" in log and len(log.strip().splitlines()) == 1, log

    (tmp_path / "smoke.py").write_text(_SMOKE)
    rc, log = run_command([str(bin_dir / "python"), "smoke.py"], env=env, cwd=tmp_path, timeout=150)
    assert rc == 0, log[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["steps"] == 4 and ranks[0]["sizes"] == [3, 13], ranks[0]
    assert ranks[0]["params"] == ranks[1]["params"]  # the ranks stay identical
    for rank in ranks:  # the codec ran through the kernels' ops, each loaded from the wheel
        names = {Path(f).name for f in rank["files"]}
        assert {"topk_select.py", "ef_accumulate.py", "scatter_add.py"} <= names, names
        assert all(Path(f).resolve().is_relative_to(venv.resolve()) for f in rank["files"]), rank["files"]
