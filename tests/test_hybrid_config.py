"""The hybrid section refuses every bad value at construction, naming the field, the value and the fix."""

from __future__ import annotations

import pytest

from hetero_strategy.config import ConfigError, HeteroConfig, HybridConfig, field_owners


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        ({"mode": "async"}, "mode", "'async'"),
        ({"mode": "hybrid", "periods": []}, "periods", "[]"),
        ({"mode": "hybrid", "periods": 8}, "periods", "8"),
        ({"periods": [8, 0, 1], "plateau_thresholds": [0.05, 0.01]}, "periods[1]", "0"),
        ({"periods": [8, 2.5, 1], "plateau_thresholds": [0.05, 0.01]}, "periods[1]", "2.5"),
        ({"periods": [True, 1], "plateau_thresholds": [0.05]}, "periods[0]", "True"),
        ({"periods": [8, 2], "plateau_thresholds": [0.05]}, "periods", "[8, 2]"),
        ({"periods": [8, 2, 1], "plateau_thresholds": [0.05]}, "plateau_thresholds", "[0.05]"),
        ({"plateau_thresholds": [0.05, 0.0]}, "plateau_thresholds[1]", "0.0"),
        ({"plateau_thresholds": [1.0, 0.01]}, "plateau_thresholds[0]", "1.0"),
        ({"plateau_thresholds": [0.05, "0.01"]}, "plateau_thresholds[1]", "'0.01'"),
        ({"plateau_thresholds": [0.01, 0.05]}, "plateau_thresholds[1]", "0.05"),
        ({"plateau_evals": 0}, "plateau_evals", "0"),
        ({"plateau_evals": 2.0}, "plateau_evals", "2.0"),
        ({"max_staleness": 0}, "max_staleness", "0"),
        ({"max_staleness": None}, "max_staleness", "None"),
        ({"staleness_decay": 0.0}, "staleness_decay", "0.0"),
        ({"staleness_decay": 1.5}, "staleness_decay", "1.5"),
        ({"local_clip_norm": 0}, "local_clip_norm", "0"),
        ({"local_clip_norm": float("inf")}, "local_clip_norm", "inf"),
        ({"local_clip_norm": "5"}, "local_clip_norm", "'5'"),
        ({"delta_density": 0.0}, "delta_density", "0.0"),
        ({"delta_density": 1.5}, "delta_density", "1.5"),
        ({"mode": "hybrid", "calibrate": True}, "calibrate", "True"),
        ({"mode": "hybrid", "precision_policy": "auto"}, "precision_policy", "'auto'"),
    ],
)
def test_bad_values_name_field_value_and_fix(kwargs, field, value):
    with pytest.raises(ConfigError) as err:
        HeteroConfig.from_flat(**kwargs)
    msg = str(err.value)
    assert msg.startswith(f"{field}={value} is invalid: "), msg
    assert len(msg.split("is invalid: ", 1)[1]) > 10  # a fix follows


def test_flat_keywords_reach_the_hybrid_section():
    assert field_owners()["mode"] == "hybrid" and field_owners()["max_staleness"] == "hybrid"
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.1], local_clip_norm=None)
    assert cfg.hybrid == HybridConfig(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.1], local_clip_norm=None)
    assert HeteroConfig().hybrid.mode == "sync"  # the default stays plain DDP
    defaults = HybridConfig()  # the defaults
    assert (defaults.periods, defaults.plateau_thresholds, defaults.plateau_evals) == ([8, 2, 1], [0.05, 0.01], 3)
    assert (defaults.max_staleness, defaults.staleness_decay, defaults.local_clip_norm) == (3, 0.9, 5.0)


def test_yaml_round_trip(tmp_path):
    cfg = HeteroConfig.from_flat(mode="hybrid", periods=[16, 4, 1], plateau_evals=5)
    cfg.to_yaml(tmp_path / "h.yaml")
    assert HeteroConfig.from_yaml(tmp_path / "h.yaml") == cfg
