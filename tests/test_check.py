"""``hetero-strategy check`` (issue 31), the wizard's use of it, and the output paths every command
checks before it starts work (``profile --json`` in a missing directory profiled first, then died)."""

from __future__ import annotations

import contextlib
import io

import pytest

from hetero_strategy import cli


def _cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue()


def _profile(tmp_path, ranks: int) -> str:
    import json

    from hetero_strategy.cluster.profile import SCHEMA

    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"schema": SCHEMA, "ranks": [
        {"rank": r, "compute_score": 1.0, "bandwidth_gbit_s": 10.0, "tier": "eth10g"} for r in range(ranks)]}))
    return str(path)


def test_a_valid_config_prints_its_resolved_settings(tmp_path):
    path = tmp_path / "hetero.yaml"
    path.write_text("compression:\n  method: topk\nbalance:\n  batch_sizes: [3, 13]\n")
    code, text = _cli(["check", str(path), "--profile", _profile(tmp_path, 2)])
    assert code == 0, text
    assert "is valid" in text
    for row in ("method", "topk", "batch_sizes", "[3, 13]", "base_density", "0.05", "set"):
        assert row in text, (row, text)


def test_every_error_is_printed_one_per_line(tmp_path):
    path = tmp_path / "hetero.yaml"
    path.write_text("compression:\n  method: zip\nbalance:\n  alpha: 2\nhybrid:\n  mode: async\n")
    code, text = _cli(["check", str(path)])
    lines = [line for line in text.splitlines() if line.startswith("check: ")]
    assert code == 2, text
    assert len(lines) == 3, text
    assert "compression='zip' is invalid" in text and "alpha=2 is invalid" in text and "mode='async'" in text


def test_a_profile_of_another_rank_count_is_refused(tmp_path):
    path = tmp_path / "hetero.yaml"
    path.write_text("balance:\n  capacities: [3, 1]\n")
    code, text = _cli(["check", str(path), "--profile", _profile(tmp_path, 3)])
    assert code == 2, text
    assert "capacities=[3, 1] is invalid: has 2 entries but the job has 3 ranks" in text


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b"[" * 5000, b"balance: 0\n"])
def test_an_unreadable_config_is_one_error(tmp_path, content):
    path = tmp_path / "hetero.yaml"
    path.write_bytes(content)
    code, text = _cli(["check", str(path)])
    assert code == 2 and "Traceback" not in text, text
    assert "is invalid: " in text


def test_profile_json_in_a_missing_directory_is_refused_before_profiling(tmp_path, monkeypatch):
    from hetero_strategy.cluster import profile

    def started(**_):
        raise AssertionError("profiled before checking --json")

    monkeypatch.setattr(profile, "run_profile", started)
    target = tmp_path / "nonexistent" / "dir" / "x.json"
    code, text = _cli(["profile", "--json", str(target)])
    assert code == 2, text
    assert f"argument --json: '{target}' is invalid: the directory {target.parent} does not exist" in text


def test_the_wizard_checks_what_it_writes(tmp_path):
    code, text = _cli(["config", "--defaults", "--device", "cpu", "--num-processes", "2", "--capacities", "3,1",
                       "--output-dir", str(tmp_path)])
    assert code == 0, text
    assert f"check: {tmp_path / 'hetero.yaml'} is valid" in text and "capacities" in text


def test_the_wizard_writes_both_files_or_neither(tmp_path):
    (tmp_path / "hetero.yaml").mkdir()
    code, text = _cli(["config", "--defaults", "--device", "cpu", "--output-dir", str(tmp_path)])
    assert code == 2, text
    assert "--hetero-file='hetero.yaml' is invalid" in text
    assert not (tmp_path / "accelerate.yaml").exists()
