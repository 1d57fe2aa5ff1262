"""Every bad value is refused at construction with the field, the value and the fix."""

from __future__ import annotations

import pytest

from hetero_strategy import ConfigError, HeteroConfig, HeteroStrategy
from hetero_strategy.config import BalanceConfig, CalibrationConfig, CompressionConfig, field_owners


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        ({"capacities": [1.0, 0.0]}, "capacities[1]", "0.0"),
        ({"capacities": [1.0, -2]}, "capacities[1]", "-2"),
        ({"capacities": []}, "capacities", "[]"),
        ({"batch_sizes": [3, 0]}, "batch_sizes[1]", "0"),
        ({"batch_sizes": [3, 2.5]}, "batch_sizes[1]", "2.5"),
        ({"batch_sizes": [3, 13], "capacities": [1, 1]}, "capacities", "[1, 1]"),
        ({"alpha": 1.5}, "alpha", "1.5"),
        ({"beta": -0.1}, "beta", "-0.1"),
        ({"alpha": 0.0, "beta": 0.0}, "alpha", "0.0"),
        ({"probe_steps": 0}, "probe_steps", "0"),
        ({"max_batch_sizes": [4, -1]}, "max_batch_sizes[1]", "-1"),
        ({"recalibrate_every": 0}, "recalibrate_every", "0"),
        ({"window": 5}, "window", "5"),
        ({"max_change": 0.0}, "max_change", "0.0"),
        ({"compression": "gzip"}, "compression", "'gzip'"),
        ({"base_density": 0.0}, "base_density", "0.0"),
        ({"base_density": 1.5}, "base_density", "1.5"),
        ({"base_density": 0.01, "min_density": 0.1}, "min_density", "0.1"),
        ({"tier": "wifi"}, "tier", "'wifi'"),
        ({"no_such_option": 1}, "no_such_option", "1"),
        ({"compression": "topk", "overlap_comm": False}, "overlap_comm", "False"),
        ({"overlap_comm": "yes"}, "overlap_comm", "'yes'"),
        ({"compression": "topk_allreduce", "selection": "threshold"}, "selection", "'threshold'"),
        ({"compression": "topk", "selection": "threshold", "threshold_headroom": 5}, "threshold_headroom", "5"),
        ({"profile": "/nonexistent/cluster.json"}, "profile", "'/nonexistent/cluster.json'"),
    ],
)
def test_bad_values_name_field_value_and_fix(kwargs, field, value):
    with pytest.raises(ConfigError) as err:
        HeteroStrategy(**kwargs)
    msg = str(err.value)
    assert msg.startswith(f"{field}={value} is invalid: "), msg
    assert len(msg.split("is invalid: ", 1)[1]) > 10  # a fix follows


def test_world_size_and_global_batch_checks():
    cfg = BalanceConfig(batch_sizes=[3, 13])
    with pytest.raises(ConfigError, match=r"batch_sizes=\[3, 13\] is invalid: has 2 entries but the job has 3 ranks"):
        cfg.check_world_size(3)
    with pytest.raises(ConfigError, match=r"batch_sizes=\[3, 13\] is invalid: they sum to 16 .* make them sum to 20"):
        cfg.check_world_size(2, 20)
    with pytest.raises(ConfigError, match=r"global batch 1 is smaller than the world size 2"):
        BalanceConfig().check_world_size(2, 1)
    BalanceConfig(max_batch_sizes=[4, 4]).check_world_size(2, 16)  # caps a pass: larger shares run as passes
    BalanceConfig(batch_sizes=[3, 13]).check_world_size(2, 16)  # fine
    with pytest.raises(ConfigError, match=r"has 2 entries but the job has 1 rank; give exactly 1 entry$"):
        cfg.check_world_size(1)  # counts in the right number (issue 32)


def test_yaml_round_trip_and_unknown_keys(tmp_path):
    cfg = HeteroConfig.from_flat(batch_sizes=[3, 13], compression="topk", recalibrate_every=25)
    path = tmp_path / "hetero.yaml"
    cfg.to_yaml(path)
    assert HeteroConfig.from_yaml(path) == cfg
    assert HeteroStrategy(config=str(path)).hetero_config == cfg
    # keywords override the file
    assert HeteroStrategy(config=path, batch_sizes=[8, 8]).hetero_config.balance.batch_sizes == [8, 8]

    path.write_text("balance:\n  batch_size: [3, 13]\n")
    with pytest.raises(ConfigError, match=r"balance.batch_size=\[3, 13\] is invalid: unknown key"):
        HeteroConfig.from_yaml(path)
    path.write_text("balancing: {}\n")
    with pytest.raises(ConfigError, match=r"balancing=\{\} is invalid: unknown section"):
        HeteroConfig.from_yaml(path)


def test_flat_kwargs_reach_their_sections():
    s = HeteroStrategy(batch_sizes=[3, 13], compression="topk", calibrate=True, find_unused_parameters=True)
    cfg = s.hetero_config
    assert cfg.balance.batch_sizes == [3, 13]
    assert cfg.compression.method == "topk"
    assert cfg.calibration.calibrate is True
    # The rest goes to DDP, beside hetero's own default (overridable, see the next test).
    assert s._ddp_kwargs == {"find_unused_parameters": True, "gradient_as_bucket_view": True}
    assert cfg.calibration == CalibrationConfig(calibrate=True)
    assert cfg.compression == CompressionConfig(method="topk")


def test_ddp_default_can_be_overridden():
    assert HeteroStrategy(gradient_as_bucket_view=False)._ddp_kwargs == {"gradient_as_bucket_view": False}


def test_field_names_are_unique_across_sections():
    import dataclasses

    from hetero_strategy.config.hetero import _SECTIONS

    names = [f.name for cls, _ in _SECTIONS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) == len(field_owners())


def test_user_comm_hook_is_refused():
    with pytest.raises(ConfigError, match="ddp_comm_hook=.* is invalid with HeteroStrategy"):
        HeteroStrategy(ddp_comm_hook=lambda s, b: None)


def test_registry_and_lightning_cli_flags():
    import lightning as L
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.strategies import StrategyRegistry

    import hetero_strategy

    assert StrategyRegistry["hetero"]["strategy"] is hetero_strategy.HeteroStrategy
    strategy = StrategyRegistry.get("hetero_topk")
    assert isinstance(strategy, hetero_strategy.HeteroStrategy)
    assert strategy.hetero_config.compression.method == "topk"
    trainer = L.Trainer(strategy="hetero", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, hetero_strategy.HeteroStrategy)

    from lit_models import Regressor

    cli = LightningCLI(Regressor, run=False, args=["--trainer.strategy=hetero", "--trainer.accelerator=cpu",
                                                   "--trainer.logger=false"])
    assert isinstance(cli.trainer.strategy, hetero_strategy.HeteroStrategy)
    cli = LightningCLI(Regressor, run=False, args=[
        "--trainer.strategy=hetero_strategy.HeteroStrategy", "--trainer.strategy.batch_sizes=[3, 13]",
        "--trainer.strategy.compression=topk", "--trainer.accelerator=cpu", "--trainer.logger=false"])
    assert cli.trainer.strategy.hetero_config.balance.batch_sizes == [3, 13]
    assert cli.trainer.strategy.hetero_config.compression.method == "topk"


def test_the_source_of_the_settings_names_the_file_and_every_keyword_on_top(monkeypatch):
    """Issue 32: a keyword that overrides the wizard's file is said at start-up, not silent."""
    monkeypatch.setenv("HETERO_STRATEGY_CONFIG", "run/hetero.yaml")
    assert HeteroConfig.source(None, {}) == "run/hetero.yaml ($HETERO_STRATEGY_CONFIG)"
    said = HeteroConfig.source(None, {"capacities": [3, 1]})
    assert said.startswith("run/hetero.yaml ($HETERO_STRATEGY_CONFIG), with capacities=[3, 1]"), said
    assert HeteroConfig.source("other.yaml", {}) == "other.yaml"  # a path given wins over the variable
    monkeypatch.delenv("HETERO_STRATEGY_CONFIG")
    assert HeteroConfig.source(None, {}) == "the defaults"
