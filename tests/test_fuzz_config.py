"""Fuzzing the config keywords and the YAML files (issue 31): every generated input is accepted,
or refused with a ConfigError naming the field, the value and what is allowed.

An accepted config must also be sound: no NaN or infinity in it, and it reads back equal from
its own dict and from the YAML file it writes. Each ``@example`` is a case the fuzzer found.
"""

from __future__ import annotations

import math
from pathlib import Path

from fuzz_inputs import FUZZ, assert_clear, assert_finite, bounded, config_kwargs, yaml_documents
from hypothesis import example, given

from hetero_strategy.config import ConfigError, HeteroConfig

SHORTHANDS = {"calibration": "calibrate", "compression": "method"}  # `calibration=v` sets calibrate=v
SPOKEN = {"method": "compression"}  # the flat name a field's messages use: method='zip' reads compression='zip'


def _names(kwargs: dict) -> list[str]:
    names = ["config", *map(str, kwargs), *(SHORTHANDS[k] for k in kwargs if k in SHORTHANDS)]
    for v in kwargs.values():
        if isinstance(v, dict):
            names += map(str, v)
    names += [SPOKEN[n] for n in names if n in SPOKEN]
    return names


def _sound(cfg: HeteroConfig, tmp: Path) -> None:
    assert_finite(cfg.to_dict())
    assert HeteroConfig.from_dict(cfg.to_dict()) == cfg, "validating twice changed the config"
    if callable(cfg.balance.sample_cost):
        return  # a function cannot go to YAML (to_yaml refuses it by name)
    path = tmp / "round.yaml"
    cfg.to_yaml(path)
    assert HeteroConfig.from_yaml(path) == cfg, "the YAML it writes reads back different"


@FUZZ
@given(kwargs=config_kwargs())
@example(kwargs={"calibration": None})  # named calibrate, the field the shorthand sets
@example(kwargs={"periods": [4, 1, 1, 1]})  # named plateau_thresholds, whose count periods sets
@example(kwargs={"method": ""})  # named compression='', the flat name of method
@example(kwargs={"growth_factor": math.nan})  # accepted: NaN < 1 is false
@example(kwargs={"init_scale": math.inf})  # accepted: an infinite first loss scale
@example(kwargs={"clip_norm": math.inf, "compression": "topk"})
@example(kwargs={"max_change": "x"})  # TypeError: '<' between float and str
@example(kwargs={"batch_sizes": (3, 13)})  # accepted, then to_yaml could not write the tuple
@example(kwargs={"tiers": ("ib", "ib")})
@example(kwargs={"batch_sizes": [[1] * 100_000]})  # a 300 kB message
@example(kwargs={"precision": {-1: False, "fp16": "x", "\x07": 2}})  # TypeError: sorting int and str keys
@example(kwargs={"side_streams": "x" * 100_000})  # a 100 kB message
@example(kwargs={"precision_policy": {1e308: "fp16"}})  # OverflowError: round(inf)
def test_config_keywords_are_accepted_or_refused_clearly(tmp_path, kwargs):
    with bounded():
        try:
            cfg = HeteroConfig.from_flat(**kwargs)
        except ConfigError as e:
            assert_clear(e, _names(kwargs))
        else:
            _sound(cfg, tmp_path)


@FUZZ
@given(document=yaml_documents())
@example(document=b"\xff\xfe\x00balance: {}\n")  # UnicodeDecodeError
@example(document="a: b\n".encode("utf-16"))
@example(document=b"[" * 5000 + b"]" * 5000)  # RecursionError in the composer
@example(document=b"precision: {1: a, x: b}\n")  # TypeError: sorting int and str keys
@example(document=b"? ''\n: [58, [0.15, -1.1]]\n")  # an empty key: the message named no field
@example(document=b"? ''\n: {}\n")
@example(document=b"compression:\n  max_change: [" + b"1, " * 20_000 + b"1]\n")  # a 60 kB message
def test_yaml_files_are_accepted_or_refused_clearly(tmp_path, document):
    path = tmp_path / "hetero.yaml"
    path.write_bytes(document)
    with bounded():
        try:
            cfg = HeteroConfig.from_yaml(path)
        except ConfigError as e:
            assert_clear(e)
        else:
            _sound(cfg, tmp_path)


def test_a_missing_or_unreadable_yaml_file_is_a_config_error(tmp_path):
    for path in (tmp_path / "missing.yaml", tmp_path):
        try:
            HeteroConfig.from_yaml(path)
        except ConfigError as e:
            assert_clear(e, ["config"])
            assert str(path) in str(e)
        else:
            raise AssertionError(f"{path} was read as a config")
