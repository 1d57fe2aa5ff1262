"""The docs site: it builds with --strict, its quickstarts run as printed, and Chromium renders it.

Chromium is Debian's package (``apt-get install chromium``; ``.ci/run`` installs it). The
rendering test dumps the DOM after the theme's scripts ran and takes a screenshot of each page.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dist_utils import launch_env, run_command

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, check=False,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_api_reference_lists_the_entry_points(site):
    html = (site / "api" / "index.html").read_text()
    for name in ("hetero_strategy.lightning.HeteroStrategy", "hetero_strategy.accelerate.HeteroPlugin",
                 "hetero_strategy.config.HeteroConfig", "hetero_strategy.hooks.weighted.weighted_allreduce_hook",
                 "hetero_strategy.hooks.compressed_hooks.topk_hook", "hetero_strategy.hooks.baselines.cast_hook"):
        assert f'id="{name}"' in html, name
    assert "precision_policy" in html  # parameters documented from the docstrings


def test_benchmark_page_carries_the_committed_results(site):
    page = (site / "benchmarks" / "index.html").read_text()
    for png in (ROOT / "benchmarks" / "results").glob("*.png"):
        assert (site / "benchmarks" / "results" / png.name).read_bytes() == png.read_bytes()
        assert f"results/{png.name}" in page
    text = re.sub(r"<[^>]+>", "", page).replace("&quot;", '"')  # the JSON, highlighted token by token
    for name in ("balance", "compression", "overlap", "accelerate_overhead", "bert_recipe", "bert_recipe_60"):
        first_key = next(iter(json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())))
        assert f'"{first_key}":' in text, name


def _code(page: str) -> str:
    return re.search(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.DOTALL).group(1)


@pytest.mark.slow
def test_lightning_quickstart_runs_as_printed(tmp_path):
    (tmp_path / "train.py").write_text(_code("quickstart-lightning.md"))
    rc, log = run_command([sys.executable, "train.py"], env=launch_env(), cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert "global batch 64 split as [48, 16]" in log  # capacities 3:1 of G = 32 x 2, as the page says
    assert re.search(r"rank 0: batch sizes \[48, 16\]", log) and re.search(r"rank 1: batch sizes \[48, 16\]", log)


@pytest.mark.slow
def test_accelerate_quickstart_runs_as_printed(tmp_path):
    (tmp_path / "train_accelerate.py").write_text(_code("quickstart-accelerate.md"))
    env = dict(launch_env(), ACCELERATE_USE_CPU="true")
    rc, log = run_command([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                           "--main_process_port", env["MASTER_PORT"], "train_accelerate.py"],
                          env=env, cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert re.search(r"rank 0: batch sizes \[48, 16\]", log) and re.search(r"rank 1: batch sizes \[48, 16\]", log)


@pytest.mark.slow
def test_fabric_page_runs_as_printed(tmp_path):
    (tmp_path / "train_fabric.py").write_text(_code("fabric.md"))
    env = launch_env()
    rc, log = run_command([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", env["MASTER_PORT"],
                           "train_fabric.py"], env=env, cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert re.search(r"rank 0: batch sizes \[3, 13\]", log) and re.search(r"rank 1: batch sizes \[3, 13\]", log)
    assert (tmp_path / "last.ckpt").is_file()


def _bash(page: str) -> list[str]:
    """The page's first ```bash command, split as a shell would."""
    return shlex.split(re.search(r"```bash\n(.*?)\n```", (ROOT / "docs" / page).read_text(), re.DOTALL).group(1))


@pytest.mark.slow
def test_lightning_cli_page_runs_as_printed(tmp_path):
    (tmp_path / "train_cli.py").write_text(_code("lightning-cli.md"))
    cmd = _bash("lightning-cli.md")
    assert cmd[:2] == ["python", "train_cli.py"], cmd
    rc, log = run_command([sys.executable, *cmd[1:]], env=launch_env(), cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert re.search(r"rank 0: batch sizes \[3, 13\]", log) and re.search(r"rank 1: batch sizes \[3, 13\]", log)


@pytest.mark.slow
def test_bare_ddp_page_runs_as_printed(tmp_path):
    (tmp_path / "train_ddp.py").write_text(_code("bare-ddp.md"))
    assert _bash("bare-ddp.md") == ["torchrun", "--nproc-per-node", "2", "train_ddp.py"]
    env = launch_env()
    rc, log = run_command([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", env["MASTER_PORT"],
                           "train_ddp.py"], env=env, cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert re.search(r"rank 0: batch sizes \[3, 13\]", log) and re.search(r"rank 1: batch sizes \[3, 13\]", log)


def _chromium(*args: str) -> str:
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", "--window-size=1280,1000", *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
@pytest.mark.parametrize(("page", "must_show"), [
    ("quickstart-lightning", ["HeteroStrategy(capacities=[3, 1])", "Quickstart: Lightning"]),
    ("quickstart-accelerate", ["plugin.prepare(accelerator, model, optimizer, loader)", "accelerate launch"]),
    ("api", ["HeteroStrategy", "HeteroPlugin", "HeteroConfig", "topk_hook"]),
])
def test_chromium_renders_page_with_code_blocks(site, tmp_path, page, must_show):
    shot = tmp_path / f"{page}.png"
    dom = _chromium(f"--screenshot={shot}", "--dump-dom", (site / page / "index.html").as_uri())  # one launch
    assert 'data-md-component="container"' in dom  # the theme's layout, not a bare HTML dump
    blocks = re.findall(r"<pre[^>]*>.*?<code[^>]*>(.*?)</code>", dom, re.DOTALL)
    assert blocks, dom[:2000]
    text = re.sub(r"<[^>]+>", "", dom).replace("&amp;", "&").replace("&quot;", '"').replace("&gt;", ">")
    for needle in must_show:
        assert needle in text, needle
    from matplotlib.image import imread

    pixels = imread(shot)  # (H, W, C) floats
    assert pixels.shape[0] >= 900 and pixels.shape[1] >= 1200
    assert pixels.std() > 0.05, "the screenshot is blank"
    keep = os.environ.get("HETERO_DOCS_SCREENSHOTS")
    if keep:  # for a person to look at
        shutil.copy(shot, Path(keep) / shot.name)
