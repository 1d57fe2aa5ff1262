"""The command line: subcommands listed, and the demo's figures on a hand-built run."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "hetero_strategy.cli", "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for name in ("demo", "emulate", "profile", "bench", "config", "check", "plan"):
        assert name in out


def _demo_ranks() -> list[dict]:
    """Two ranks, three rounds of two steps per mode; round 0 is warm-up. Rank 0 computes 0.4 s for 30
    samples, rank 1 0.8 s for 10; DDP's measured steps take 1.0, 1.2 | 1.0, 0.8 s, hetero's 0.5 s."""
    rounds = [0, 0, 1, 1, 2, 2]

    def mode(step_s: list[float], batch: int, compute: float) -> dict:
        return {"round": rounds, "step_s": step_s, "batches": [batch] * 6, "compute_s": [compute] * 6}

    return [{"modes": {"ddp": mode([9.0, 9.0, 1.0, 1.2, 1.0, 0.8], 30, 0.4),
                       "hetero_auto": mode([9.0, 9.0, 0.5, 0.5, 0.5, 0.5], 30, 0.4)},
             "accuracy": {"ddp": 0.9, "hetero_auto": 0.91}},
            {"modes": {"ddp": mode([0.0] * 6, 10, 0.8), "hetero_auto": mode([0.0] * 6, 10, 0.8)}}]


def test_demo_figures_by_hand():
    from hetero_strategy.commands.demo_report import figures, markdown, speedup

    ranks = _demo_ranks()
    f = figures(ranks, "ddp", warmup_rounds=1)
    assert f["samples_per_s"] == pytest.approx(40.0)  # 40 samples / median(1.0, 1.2, 1.0, 0.8) s
    assert f["samples_per_s_rounds"] == pytest.approx([40 / 1.1, 40 / 0.9])  # each round's median step
    assert f["batch_sizes"] == [30, 10]
    assert f["fast_rank_idle_fraction"] == pytest.approx(0.6)  # rank 0 is fast per sample
    assert f["balance"] == pytest.approx(0.5)
    assert f["accuracy"] == 0.9
    modes = {m: figures(ranks, m, 1) for m in ("ddp", "hetero_auto")}
    ratio = speedup(modes)
    assert ratio["median"] == pytest.approx(2.0)  # 80 / 40: the ratio of the medians
    assert ratio["rounds"] == pytest.approx([2.2, 1.8]) and (ratio["min"], ratio["max"]) == pytest.approx((1.8, 2.2))
    result = {"modes": modes, "speedup": ratio, "rounds": 3, "warmup_rounds": 1, "block": 2, "commit": "abc1234",
              "emulation": "namespaces", "compute": "1.0,0.57", "link": "10gbit", "batch_per_rank": 20,
              "seconds": 90.0}
    table = markdown(result)
    assert "| plain DDP | 40 (36–44) | 1.00x | 60% | 0.50 | 30/10 | 0.900 |" in table
    assert "| hetero | 80 (80–80) | 2.00x (1.80–2.20) | 20% | 0.50 | 30/10 | 0.910 |" in table
    assert "Commit abc1234" in table and "last 2 rounds" in table and "took 1.5 min" in table


def test_the_readmes_demo_table_is_the_committed_result():
    # The README's figures are rendered from benchmarks/results/demo.json, never typed by hand.
    import json
    from pathlib import Path

    from hetero_strategy.commands.demo_report import markdown

    root = Path(__file__).resolve().parents[1]
    result = json.loads((root / "benchmarks" / "results" / "demo.json").read_text())
    assert markdown(result) in (root / "README.md").read_text()


def _cli(argv: list[str]) -> tuple[int, str]:
    """(exit status, everything printed) of one in-process run of the command."""
    import contextlib
    import io

    from hetero_strategy import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse's --help and its refusals
            code = e.code
    return code, out.getvalue()


def test_bench_runs_the_checkouts_benchmarks():
    from pathlib import Path

    from hetero_strategy.commands import bench

    assert bench.benchmarks_dir() == Path(__file__).resolve().parents[1] / "benchmarks"
    code, text = _cli(["bench", "soak", "--help"])
    assert code == 0 and "--flap-at" in text  # the mode's own flags, from benchmarks/hetero_bench/soak.py


@pytest.mark.parametrize("argv", [["bench", "balance", "--json", "x.json", "--rounds", "1"], ["bench"],
                                  ["bench", "soak"]])
def test_bench_from_a_wheel_says_where_the_benchmarks_are(tmp_path, monkeypatch, argv):
    from hetero_strategy.commands import bench

    monkeypatch.setattr(bench, "CHECKOUT", tmp_path / "site-packages")  # as installed: no benchmarks/ beside src/
    assert bench.benchmarks_dir() is None
    code, text = _cli(argv)
    assert code == 2, text
    assert text.strip().count("\n") == 0 and "make install" in text and "clone" in text, text
    code, text = _cli(["bench", "--help"])
    assert code == 0 and all(mode in text for mode in bench.MODES), text


# Every command that takes --compute / --link, with values argparse accepts one by one but that do
# not describe a cluster (too few ranks, more links than ranks); a single rate where a list is given.
_BAD_CLUSTER = [
    ("demo --compute 1.0", "--compute='1.0'"),
    ("demo --compute 1.0,0.5 --link 1gbit,1gbit,1gbit", "--link='1gbit,1gbit,1gbit'"),
    ("emulate --compute 1.0,0.5 --link 1gbit,1gbit,1gbit -- true", "--link='1gbit,1gbit,1gbit'"),
    ("emulate --nodes 1,1 --link 1gbit,1gbit,1gbit -- true", "--nodes='1,1'"),
    ("bench balance --compute 1.0", "--compute='1.0'"),
    ("bench balance --compute 1.0,0.5 --link 1gbit,1gbit,1gbit", "--link='1gbit,1gbit,1gbit'"),
    ("bench lengths --compute 1.0", "--compute='1.0'"),
    ("bench lengths --compute 1.0,0.5 --link 1gbit,1gbit,1gbit", "--link='1gbit,1gbit,1gbit'"),
    ("bench hybrid --compute 1.0", "--compute='1.0'"),
    ("bench hybrid --compute 1.0,0.5 --link 1gbit,1gbit,1gbit", "--link='1gbit,1gbit,1gbit'"),
    ("bench soak --compute 1.0", "--compute='1.0'"),
    ("bench soak --compute 1.0,0.5 --link 1gbit,1gbit,1gbit", "--link='1gbit,1gbit,1gbit'"),
    ("bench soak --flap fast", "'fast'"),
    ("bench compression --link 1gbit,100mbit", "'1gbit,100mbit'"),
    ("bench overlap --link 1gbit,100mbit", "'1gbit,100mbit'"),
]


@pytest.mark.parametrize(("argv", "needle"), _BAD_CLUSTER)
def test_bad_cluster_flags_exit_2_naming_the_flag_and_value(monkeypatch, argv, needle):
    from hetero_strategy.emulate import cluster

    def started(*_a, **_k):
        raise AssertionError("the command built a cluster before refusing its flags")

    monkeypatch.setattr(cluster.EmulatedCluster, "start", started)
    code, text = _cli(argv.split())
    assert code == 2, text
    assert needle in text, text
    assert "Traceback" not in text, text


def test_no_module_of_the_package_imports_the_benchmarks_or_the_tests():
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "src" / "hetero_strategy"
    outside = ("hetero_bench", "tests", "benchmarks", "dist_utils", "ef_oracle", "oracle", "lit_models")
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in outside, f"{path.relative_to(package)} imports {name}"
