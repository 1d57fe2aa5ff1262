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


def _bash(page: str) -> list[list[str]]:
    """The lines of each bash block of a page, in order."""
    return [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / page).read_text(),
                                                         re.DOTALL)]


# Lightning's known-harmless messages that hetero filters (hetero_strategy/lightning/quiet.py), and the
# progress bar's epoch total under max_steps: Lightning's RichProgressBar alone prints "Epoch 1/-2".
_LIGHTNING_NOISE = ("LeafSpec", "litlogger", "/-2")


@pytest.mark.slow
def test_lightning_quickstart_runs_as_printed(tmp_path):
    (tmp_path / "train.py").write_text(_code("quickstart-lightning.md"))
    rc, log = run_command([sys.executable, "train.py"], env=launch_env(), cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert "global batch 64 split as [48, 16]" in log  # capacities 3:1 of G = 32 x 2, as the page says
    assert re.search(r"rank 0: batch sizes \[48, 16\]", log) and re.search(r"rank 1: batch sizes \[48, 16\]", log)
    assert log.count("global batch 64 split as") == 1  # our messages: once, by rank 0
    assert not [noise for noise in _LIGHTNING_NOISE if noise in log], log[-4000:]
    # 2048 samples / G = 64: 32 steps per epoch, so max_steps=50 ends in epoch 1 of 0..1.
    assert "Epoch 1/1 " in log, log[-2000:]


def _same_split_on_both_ranks(log: str) -> list[int]:
    """The split both ranks print at the end (docs/design.md semantics 1: b_r >= 1, sum = G = 32 x 2)."""
    # NOTE: not anchored at a line start: the two ranks' output may interleave in the launcher's pipe
    found = {rank: sizes for rank, sizes in re.findall(r"rank (\d): batch sizes (\[\d+, \d+\])", log)}
    assert set(found) == {"0", "1"} and found["0"] == found["1"], log[-4000:]
    sizes = json.loads(found["0"])
    assert sum(sizes) == 64 and min(sizes) >= 1, sizes
    assert log.count("global batch 64 split as") == 1, log[-4000:]  # our messages: once, by rank 0
    return sizes


@pytest.mark.slow
def test_accelerate_quickstart_runs_as_printed(tmp_path):
    (tmp_path / "train.py").write_text(_code("quickstart-accelerate.md"))
    (line,) = _bash("quickstart-accelerate.md")[1]  # without the wizard's files: the defaults, a probe
    env = dict(launch_env(), ACCELERATE_USE_CPU="true")
    command = line.split()[1:]
    assert command[:2] == ["accelerate", "launch"]
    rc, log = run_command([str(BIN / "accelerate"), *command[1:-1], "--main_process_port", env["MASTER_PORT"],
                           command[-1]], env=env, cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    _same_split_on_both_ranks(log)


@pytest.mark.slow
def test_accelerate_quickstart_through_the_wizard_defaults(tmp_path, monkeypatch, capsys):
    """The page's path: train.py, `hetero-strategy config` with Enter at every question on a CPU
    machine, then the line the wizard printed last, run as printed. Enter everywhere writes what
    `--defaults` writes (docs/wizard.md), and on CPU that is a 2-rank job."""
    import pexpect
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    from hetero_strategy.cli import main as cli_main
    from hetero_strategy.commands import config as config_command
    from hetero_strategy.config import HeteroConfig

    (tmp_path / "train.py").write_text(_code("quickstart-accelerate.md"))
    (wizard, page_line), _ = _bash("quickstart-accelerate.md")
    env = launch_env(TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", NO_COLOR="1", CUDA_VISIBLE_DEVICES="")
    # One flag more than the page: Accelerate's port (asked only for several machines; 29500 without
    # it), so that this job cannot meet another one on this machine.
    program, *args = wizard.split()
    child = pexpect.spawn(str(BIN / program), [*args, "--main-process-port", env["MASTER_PORT"]], cwd=str(tmp_path),
                          env=env, encoding="utf-8", timeout=60, dimensions=(50, 220))
    try:
        for question in ("In which compute environment", "Which type of machine", "How many processes",
                         "from a cluster profile", "Link tier of each rank", "How should the global batch be split",
                         "Which gradient compression", "online calibration"):
            child.expect_exact(question)
            child.send("\r")  # Enter: the default
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    monkeypatch.setattr(config_command, "_visible_gpus", lambda: 0)  # as CUDA_VISIBLE_DEVICES="" above
    flagged = tmp_path / "flagged"
    assert cli_main(["config", "--defaults", "--main-process-port", env["MASTER_PORT"], "--output-dir", str(flagged)]) == 0
    capsys.readouterr()
    for name in ("accelerate.yaml", "hetero.yaml"):
        assert (tmp_path / name).read_text() == (flagged / name).read_text(), name
    acc = load_config_from_file(str(flagged / "accelerate.yaml"))
    assert acc.distributed_type == DistributedType.MULTI_GPU and acc.num_processes == 2 and acc.use_cpu is True
    assert HeteroConfig.from_yaml(flagged / "hetero.yaml") == HeteroConfig()

    printed = re.findall(r"HETERO_STRATEGY_CONFIG=[^\r\n]*", child.before)
    assert printed == [page_line], printed  # the page shows exactly what the wizard prints
    rc, log = run_command(["bash", "-c", printed[0]], env=launch_env(), cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    # HeteroPlugin() says where its settings come from (once); the wizard's default balance is a probe.
    assert log.count("hetero: settings from hetero.yaml ($HETERO_STRATEGY_CONFIG)\n") == 1, log[-4000:]
    assert "hetero: probed per rank" in log
    _same_split_on_both_ranks(log)


@pytest.mark.slow
def test_fabric_page_runs_as_printed(tmp_path):
    (tmp_path / "train_fabric.py").write_text(_code("fabric.md"))
    env = launch_env()
    rc, log = run_command([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", env["MASTER_PORT"],
                           "train_fabric.py"], env=env, cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert re.search(r"rank 0: batch sizes \[3, 13\]", log) and re.search(r"rank 1: batch sizes \[3, 13\]", log)
    assert (tmp_path / "last.ckpt").is_file()


def _first_command(page: str) -> list[str]:
    """The page's first ```bash block, split as a shell would."""
    return shlex.split("\n".join(_bash(page)[0]))


@pytest.mark.slow
def test_lightning_cli_page_runs_as_printed(tmp_path):
    (tmp_path / "train_cli.py").write_text(_code("lightning-cli.md"))
    cmd = _first_command("lightning-cli.md")
    assert cmd[:2] == ["python", "train_cli.py"], cmd
    rc, log = run_command([sys.executable, *cmd[1:]], env=launch_env(), cwd=tmp_path, timeout=180)
    assert rc == 0, log[-4000:]
    assert re.search(r"rank 0: batch sizes \[3, 13\]", log) and re.search(r"rank 1: batch sizes \[3, 13\]", log)


@pytest.mark.slow
def test_bare_ddp_page_runs_as_printed(tmp_path):
    (tmp_path / "train_ddp.py").write_text(_code("bare-ddp.md"))
    assert _first_command("bare-ddp.md") == ["torchrun", "--nproc-per-node", "2", "train_ddp.py"]
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
