"""Bad input wherever a user can reach, as a table: every config field, YAML files, environment
variables, profile JSON, checkpoints and every command's flags. Each gets a one-line error naming
the input, the value and the fix, raised by this project's code (no traceback from inside torch)
and before any work starts (no emulator, no ranks, no benchmark)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import traceback

import pytest

from hetero_strategy.config import (
    BalanceConfig,
    CalibrationConfig,
    CompressionConfig,
    ConfigError,
    HeteroConfig,
    HybridConfig,
    PrecisionConfig,
    ReliabilityConfig,
)

# field -> (a bad value, what the message must name besides the field)
CONFIG = {
    "batch_sizes": ([3, 0], "batch_sizes[1]=0"), "capacities": ([1.0, -2.0], "capacities[1]=-2.0"),
    "alpha": (-0.1, "alpha=-0.1"), "beta": ("high", "beta='high'"), "max_batch_sizes": ([0], "max_batch_sizes[0]=0"),
    "probe_steps": (0, "probe_steps=0"), "memory_margin": (1.5, "memory_margin=1.5"), "seed": ("zero", "seed='zero'"), "profile": (42, "profile=42"),
    "sample_cost": (3.5, "sample_cost=3.5"), "loss_normalization": ("words", "'samples' or 'tokens'"),
    "calibrate": ("yes", "calibrate='yes'"), "cold_start_steps": (-1, "cold_start_steps=-1"),
    "recalibrate_every": (0, "recalibrate_every=0"), "window": (0, "window=0"), "max_change": (1.5, "max_change=1.5"),
    "method": ("zip", "compression='zip'"), "base_density": (0.0, "base_density=0.0"),
    "min_density": (2.0, "min_density=2.0"), "tier": ("wifi", "tier='wifi'"), "tiers": (["ib", "5g"], "tiers[1]='5g'"),
    "tier_profile": (7, "tier_profile=7"), "tier_overrides": ({"ib": {"speed": 1}}, "tier_overrides.ib.speed=1"),
    "dense_warmup_steps": (0, "dense_warmup_steps=0"), "density_period": (0, "density_period=0"),
    "density_schedule": ("linear", "density_schedule='linear'"), "ef_gamma": (0.0, "ef_gamma=0.0"),
    "density_warmup": ("linear", "density_warmup='linear'"), "momentum_correction": (1.0, "momentum_correction=1.0"),
    "momentum_masking": ("yes", "momentum_masking='yes'"),
    "dense_sync_every": (-5, "dense_sync_every=-5"), "clip_norm": (-1.0, "clip_norm=-1.0"),
    "compression_backend": ("cuda", "compression_backend='cuda'"), "dense_fallback": ("maybe", "dense_fallback="),
    "pipeline_stages": (9, "pipeline_stages=9"), "side_streams": ("yes", "side_streams='yes'"), "powersgd_rank": (0, "powersgd_rank=0"),
    "overlap_comm": (1, "overlap_comm=1"), "hierarchical": ("on", "hierarchical='on'"),
    "selection": ("fast", "selection='fast'"), "threshold_every": (0, "threshold_every=0"),
    "threshold_headroom": (0.5, "threshold_headroom=0.5"),
    "fast_groups": ([[0, 1], "2"], "fast_groups[1]='2'"), "precision_policy": ("fp8", "precision_policy='fp8'"),
    "keep_fp32": ("LayerNorm", "keep_fp32='LayerNorm'"), "init_scale": (0, "init_scale=0"),
    "growth_factor": (0.5, "growth_factor=0.5"), "backoff_factor": (1.0, "backoff_factor=1.0"),
    "growth_interval": (0, "growth_interval=0"), "nonfinite": ("ignore", "nonfinite='ignore'"),
    "stall_timeout_s": (0, "stall_timeout_s=0"), "checkpoint_dir": ("", "checkpoint_dir=''"),
    "checkpoint_every_steps": (0, "checkpoint_every_steps=0"), "checkpoint_every_s": (-1, "checkpoint_every_s=-1"),
    "keep_checkpoints": (0, "keep_checkpoints=0"), "resume": ("always", "resume='always'"),
    "mode": ("async", "mode='async'"), "periods": ([8, 2], "periods=[8, 2]"),
    "plateau_thresholds": ([0.01, 0.05], "plateau_thresholds[1]=0.05"), "plateau_evals": (0, "plateau_evals=0"),
    "max_staleness": (0, "max_staleness=0"), "staleness_decay": (0.0, "staleness_decay=0.0"),
    "local_clip_norm": (-1.0, "local_clip_norm=-1.0"), "delta_density": (2.0, "delta_density=2.0"),
    "delta_codec": ("gzip", "delta_codec='gzip'"),
}

# flags -> what the output must name; nothing may start (see _no_work)
CLI = [
    ("demo --compute 1.0,-0.5", "--compute"), ("demo --link 10zbit", "'10zbit'"), ("demo --batch 0", "--batch"),
    ("demo --rounds 4 --warmup-rounds 4", "--warmup-rounds=4"), ("demo --timeout -1", "--timeout"),
    ("emulate --compute 1.5 -- true", "--compute"), ("emulate --nodes 1,x -- true", "--nodes='1,x'"),
    ("emulate --link fast -- true", "'fast'"), ("emulate --nproc 0 -- true", "--nproc"),
    ("emulate --timeout 0 -- true", "--timeout"), ("emulate --compute 1,1", "-- python train.py"),
    ("profile --max-bytes 0", "--max-bytes"), ("profile --budget -1", "--budget"), ("profile --matmul-n 0", "--matmul-n"),
    ("bench compression --rounds -1", "--rounds"), ("bench compression --ranks 3", "--ranks"), ("bench compression --link abc", "'abc'"),
    ("bench compression --methods dense_fp32 bogus", "'bogus' is unknown"), ("bench compression --seeds 0", "--seeds"),
    ("bench compression --target 1.5", "--target"), ("bench balance --rounds 0", "--rounds"),
    ("bench balance --compute 0.5", "--compute='0.5'"), ("bench balance --trainings ddp,bogus", "--trainings="),
    ("bench balance --steps 5 --measure 10", "--measure"), ("bench balance --sweep --sweep-points a,b", "--sweep-points"),
    ("bench balance --link 10gbit,1gbit,5gbit", "--link="), ("bench accelerate --models bogus", "'bogus' is unknown"),
    ("bench accelerate --batch 0", "--batch"), ("bench overlap --stages 0", "--stages"),
    ("bench overlap --density 2", "--density"), ("bench overlap --numel 0", "--numel"),
    ("bench overlap --local --mtu 9000", "--mtu=9000 is invalid with --local"),
    ("emulate --simulate --mtu 9000 -- true", "mtu=9000 is invalid with simulate=True"),
    ("bench lengths --compute 2,1", "--compute"), ("bench lengths --steps 3 --measure 5", "--measure=5"),
    ("config --num-processes zero --defaults", "num_processes='zero'"),
    ("config --compression bogus --defaults", "bogus"), ("config --answers /nonexistent.yaml", "/nonexistent.yaml"),
]


def _assert_clear(error: BaseException, *needles: str) -> None:
    """One line naming every needle, with a fix after "invalid", raised by this project's code."""
    message = str(error)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)
    origin = traceback.extract_tb(error.__traceback__)[-1].filename
    assert "hetero_strategy" in origin or "triton_kernels" in origin, f"raised in {origin}: {message}"


def test_every_config_field_has_a_case():
    fields = {f.name for c in (BalanceConfig, CalibrationConfig, CompressionConfig, PrecisionConfig,
                               ReliabilityConfig, HybridConfig) for f in dataclasses.fields(c)}
    assert fields == set(CONFIG), f"fields without a bad-input case: {sorted(fields - set(CONFIG))}"


@pytest.mark.parametrize("field", list(CONFIG))
def test_a_bad_config_field_is_refused_at_construction(field):
    value, needle = CONFIG[field]
    key = "compression" if field == "method" else field
    with pytest.raises(ConfigError) as e:
        HeteroConfig.from_flat(**{key: value})
    _assert_clear(e.value, needle, "is invalid: ")
    assert len(str(e.value).split("is invalid: ", 1)[1]) > 10, "no fix given"


@pytest.mark.parametrize(("text", "needles"), [
    ("balance:\n  batch_sizes: [3, -1]\n", ("batch_sizes[1]=-1",)),
    ("balanse:\n  seed: 1\n", ("balanse", "known sections")),
    ("compression:\n  metod: topk\n", ("compression.metod", "known keys")),
    ("compression: [topk\n", ("not valid YAML at line", "hetero-strategy config")),
    ("- 1\n- 2\n", ("top level must be a mapping",)),
])
def test_a_bad_yaml_file_names_the_key_and_the_fix(tmp_path, text, needles):
    path = tmp_path / "hetero.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        HeteroConfig.from_yaml(path)
    _assert_clear(e.value, *needles)


def test_environment_variables(monkeypatch, tmp_path):
    from hetero_strategy.accelerate import HeteroPlugin
    from hetero_strategy.hooks.tiers import resolve_tier
    from triton_kernels import dispatch

    monkeypatch.setenv("HETERO_STRATEGY_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError) as e:
        HeteroPlugin()
    _assert_clear(e.value, "HETERO_STRATEGY_CONFIG=", "missing.yaml", "no such file")
    monkeypatch.setenv("HETERO_TIER", "wifi")
    with pytest.raises(ValueError) as e:
        resolve_tier(None)
    _assert_clear(e.value, "HETERO_TIER='wifi'", "nvlink, ib, eth10g, eth1g")
    monkeypatch.setenv("HETERO_KERNELS", "cuda")
    dispatch.reload_env()
    try:
        with pytest.raises(ValueError) as e:
            dispatch.get_backend()
        _assert_clear(e.value, "HETERO_KERNELS", "'cuda'", "auto")
    finally:
        monkeypatch.delenv("HETERO_KERNELS")
        dispatch.reload_env()


def _profile(ranks: int) -> dict:
    from hetero_strategy.cluster.profile import SCHEMA

    return {"schema": SCHEMA, "ranks": [{"rank": r, "compute_score": 1.0, "bandwidth_gbit_s": 10.0, "tier": "eth10g"}
                                        for r in range(ranks)]}


@pytest.mark.parametrize(("content", "needles"), [
    (json.dumps(_profile(2))[:40], ("not JSON at line", "hetero-strategy profile")),       # truncated
    (json.dumps({**_profile(2), "schema": "hetero-profile/0"}), ("schema 'hetero-profile/0'",)),
    (json.dumps({**_profile(2), "ranks": [{"rank": 0}]}), ("ranks[0].compute_score=None", "number > 0")),
    (json.dumps(_profile(3)), ("describes 3 ranks but the job has 2",)),                    # world-size mismatch
])
def test_a_bad_profile_json_is_refused(tmp_path, content, needles):
    from hetero_strategy.runtime.planner import profile_bandwidth

    path = tmp_path / "profile.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        profile_bandwidth(str(path), 2)
    _assert_clear(e.value, f"profile={str(path)!r}", *needles)


def test_a_truncated_lightning_checkpoint_is_refused(tmp_path):
    import torch

    from hetero_strategy import HeteroStrategy

    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "hetero_strategy": None}, good)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ConfigError) as e:
        HeteroStrategy().load_checkpoint(bad)
    _assert_clear(e.value, f"ckpt_path={str(bad)!r}", "truncated")


def test_a_checkpoint_from_another_config_or_world_size(recwarn):
    from hetero_strategy.runtime import HeteroRuntime

    saved = HeteroRuntime(HeteroConfig.from_flat(compression="topk"), 0, 1).gathered_state_dict()
    with pytest.raises(ConfigError) as e:
        HeteroRuntime(HeteroConfig(), 0, 1).load_gathered_state_dict(saved)
    _assert_clear(e.value, "checkpoint compression='topk'", "compression='none'", "resume with")
    # another world size is not an error (an elastic restart): shares are planned afresh, with a warning
    warned = []
    runtime = HeteroRuntime(HeteroConfig.from_flat(compression="topk"), 0, 2, warn=warned.append)
    assert runtime.load_gathered_state_dict(saved) is False
    assert "checkpoint of 1 rank resumed on 2" in warned[0] and "(0 values" in warned[0]


@pytest.fixture()
def _no_work(monkeypatch):
    """Any real work (an emulated cluster, ranks, a profile, a benchmark stage) fails the case."""
    import subprocess

    import hetero_bench._ranks as ranks
    from hetero_bench import compression

    from hetero_strategy.cluster import profile
    from hetero_strategy.emulate import cluster

    def started(*_a, **_k):
        raise AssertionError("the command started work before refusing its input")

    for target, name in [(cluster.EmulatedCluster, "start"), (ranks, "run_job"), (profile, "run_profile"),
                         (compression, "_local"), (compression, "_emulated"), (subprocess, "Popen"),
                         (subprocess, "run")]:
        monkeypatch.setattr(target, name, started)


@pytest.mark.parametrize(("argv", "needle"), CLI)
@pytest.mark.usefixtures("_no_work")
def test_a_bad_flag_is_refused_before_any_work(argv, needle):
    from hetero_strategy import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main(argv.split())
        except SystemExit as e:  # argparse: the flag, the value and the fix in its one-line error
            code = e.code
    text = out.getvalue()
    assert code == 2, text
    assert needle in text, text
    assert "Traceback" not in text, text


def test_lightning_refuses_checkpoint_dir_and_says_what_works_there():
    from hetero_strategy import HeteroStrategy

    with pytest.raises(ConfigError) as e:
        HeteroStrategy(checkpoint_dir="ckpt")
    _assert_clear(e.value, "checkpoint_dir='ckpt'", "ModelCheckpoint", "ckpt_path='last'")
