"""The command line: subcommands listed, and the demo's figures on a hand-built run."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_help_lists_subcommands():
    out = subprocess.run([sys.executable, "-m", "hetero_strategy.cli", "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for name in ("demo", "emulate", "profile", "bench", "config"):
        assert name in out


def test_demo_figures_by_hand():
    from hetero_strategy.commands.demo import figures

    # Two ranks, steps of 1.0 s; rank 0 computes 0.4 s for 30 samples, rank 1 0.8 s for 10.
    starts = [0.0, 1.0, 2.0, 3.0]
    ranks = [{"starts": starts, "batches": [30] * 3, "compute_s": [0.4] * 3, "accuracy": 0.9},
             {"starts": starts, "batches": [10] * 3, "compute_s": [0.8] * 3}]
    f = figures(ranks, measure=3)
    assert f["samples_per_s"] == pytest.approx(40.0)
    assert f["batch_sizes"] == [30, 10]
    assert f["fast_rank_idle_fraction"] == pytest.approx(0.6)  # rank 0 is fast per sample
    assert f["balance"] == pytest.approx(0.5)
    assert f["accuracy"] == 0.9
