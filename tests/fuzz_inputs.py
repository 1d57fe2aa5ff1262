"""Hypothesis strategies for every input a user can type, and the property they must meet.

Four surfaces (issue 31): HeteroConfig keyword sets, YAML files, cluster-profile JSON files and the
CLI's argument lists. The property: an input is accepted, or refused with ``ConfigError`` (the
API and the files) or argparse's usage error, exit status 2 (the CLI), whose one-line message
names the field or flag, the bad value and what is allowed. Nothing else escapes, no case runs
longer than ``CASE_SECONDS``, and a refused input leaves no file behind.

``FUZZ`` sizes the run: ``make test`` runs a fixed-seed subset (derandomized, ``HETERO_FUZZ_EXAMPLES``
unset); ``make fuzz`` sets ``HETERO_FUZZ_EXAMPLES=5000`` and a fresh random seed per run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import typing
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hetero_strategy.config import (
    COMPRESSION_METHODS,
    DTYPE_NAMES,
    HYBRID_MODES,
    NONFINITE_ACTIONS,
    TIERS,
    BalanceConfig,
    CalibrationConfig,
    CompressionConfig,
    HybridConfig,
    PrecisionConfig,
    ReliabilityConfig,
)

EXAMPLES = int(os.environ.get("HETERO_FUZZ_EXAMPLES", "0"))
CASE_SECONDS = 20.0
FUZZ = settings(
    max_examples=EXAMPLES or 120, derandomize=not EXAMPLES, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture, HealthCheck.large_base_example],
)
"""The subset in ``make test`` (120 cases per test, one fixed seed) or ``make fuzz``'s size."""

SECTIONS = {"balance": BalanceConfig, "calibration": CalibrationConfig, "compression": CompressionConfig,
            "precision": PrecisionConfig, "reliability": ReliabilityConfig, "hybrid": HybridConfig}
FIELDS = {f.name: cls for cls in SECTIONS.values() for f in dataclasses.fields(cls) if f.init}
WORDS = sorted({*COMPRESSION_METHODS, *TIERS, *DTYPE_NAMES, *HYBRID_MODES, *NONFINITE_ACTIONS, "auto", "none",
                "dense", "cosine", "constant", "exponential", "exact", "threshold", "samples", "tokens",
                "never", "torch", "triton", "tier_factor", "exchange_every", "gamma", "codec", "rank",
                "V100", "7.0", "default", "lengths", ""})


class CaseHang(AssertionError):
    """A case ran past CASE_SECONDS."""


@contextlib.contextmanager
def bounded(seconds: float = CASE_SECONDS):
    """Fail the case (not the run) when it takes longer than ``seconds``: no input may hang."""
    def expire(*_):
        raise CaseHang(f"the case ran longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- values --------------------------------------------------------------------------------
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1.0, 0.5, 1e-300, 1e300, math.nan, math.inf, -math.inf, 0.05, 0.15, 1.25, 4.0])
INTS = st.integers(-3, 130) | st.integers() | st.sampled_from([2**63, -(2**63), 10**30])
TEXT = st.sampled_from(WORDS) | st.text(max_size=12)
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
                   | st.dictionaries(TEXT | INTS, inner, max_size=4), max_leaves=12)
HUGE = st.sampled_from([[1] * 20_000, ["ib"] * 20_000, [0.5] * 20_000 + ["x"], "x" * 100_000, 10**400,
                        [[0, 1]] * 20_000, {f"k{i}": i for i in range(10_000)}])


def _typed(tp: Any) -> st.SearchStrategy:
    """Values of roughly the annotated type, so cases get past the type checks to the range and
    cross-field checks."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return st.none()
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", ())):
        return st.one_of(*[_typed(a) for a in args])
    if tp is bool:
        return st.booleans()
    if tp is int:
        return INTS
    if tp is float:
        return FLOATS | INTS
    if tp is str:
        return TEXT
    if origin in (list, tuple):
        inner = _typed(args[0]) if args else SCALARS
        return st.lists(inner, max_size=6) | st.lists(inner, max_size=6).map(tuple)
    if origin is dict:
        key = _typed(args[0]) if args else TEXT
        return st.dictionaries(key, _typed(args[1]) if len(args) > 1 else ANY, max_size=4)
    if origin is not None and getattr(origin, "__name__", "") == "Callable":
        return st.just(lambda i: 1.0)
    return ANY


_HINTS = {name: typing.get_type_hints(cls)[name] for name, cls in FIELDS.items()}


def field_value(name: str) -> st.SearchStrategy:
    """A value for one field: typed most of the time, anything or huge now and then."""
    special = {"tier_overrides": st.dictionaries(st.sampled_from(TIERS) | TEXT, st.dictionaries(
        st.sampled_from(["tier_factor", "exchange_every", "gamma", "codec", "rank"]) | TEXT, ANY, max_size=3),
        max_size=3),
        "fast_groups": st.lists(st.lists(st.integers(-1, 5), max_size=3), max_size=3),
        "precision_policy": st.dictionaries(FLOATS | TEXT, TEXT, max_size=3) | _typed(_HINTS["precision_policy"])}
    typed = special[name] if name in special else _typed(_HINTS[name])
    return st.one_of(typed, typed, typed, ANY, HUGE)


def config_kwargs() -> st.SearchStrategy[dict[str, Any]]:
    """Flat keyword sets for ``HeteroConfig.from_flat``: fields, sections (mappings, shorthands,
    anything) and unknown names."""
    unknown = st.from_regex(r"\A[a-z_]{1,14}\Z").filter(lambda k: k not in FIELDS and k not in SECTIONS)
    keys = st.lists(st.sampled_from(sorted(FIELDS)) | st.sampled_from(sorted(SECTIONS)) | unknown,
                    unique=True, max_size=6)

    def values(names: list[str]) -> st.SearchStrategy:
        return st.fixed_dictionaries({k: field_value(k) if k in FIELDS else section_value(k) if k in SECTIONS
                                      else ANY for k in names})

    return keys.flatmap(values)


def section_value(section: str) -> st.SearchStrategy:
    names = [f.name for f in dataclasses.fields(SECTIONS[section]) if f.init]
    mapping = st.lists(st.sampled_from(names) | TEXT, unique=True, max_size=4).flatmap(
        lambda ks: st.fixed_dictionaries({k: field_value(k) if k in FIELDS else ANY for k in ks}))
    return mapping | mapping | ANY


# ---- files ---------------------------------------------------------------------------------
def _mangle(text: str) -> st.SearchStrategy[bytes]:
    """The text as written, truncated, with bytes spliced in, or not UTF-8 at all."""
    raw = text.encode()
    return st.one_of(
        st.just(raw), st.just(raw),
        st.integers(0, max(len(raw) - 1, 0)).map(lambda n: raw[:n]),
        st.tuples(st.integers(0, len(raw)), st.binary(min_size=1, max_size=4)).map(
            lambda t: raw[:t[0]] + t[1] + raw[t[0]:]),
        st.just(text.encode("utf-16")), st.just(b"\xff\xfe\x00" + raw), st.just(b""),
    )


def yaml_documents() -> st.SearchStrategy[bytes]:
    """YAML files: nested sections of typed and wrong values, wrong shapes, unknown keys, deep
    nesting, alias bombs, truncated text and bytes that are not UTF-8."""
    import yaml

    def dump(data: Any) -> str:
        try:
            return yaml.safe_dump(data, sort_keys=False)
        except yaml.YAMLError:
            return repr(data)

    sections = st.dictionaries(st.sampled_from(sorted(SECTIONS)) | TEXT,
                               st.sampled_from(sorted(SECTIONS)).flatmap(section_value), max_size=4)
    shaped = (sections | ANY | st.lists(sections, max_size=2)).map(lambda d: dump(_plain(d)))
    weird = st.sampled_from([
        "[" * 5000 + "]" * 5000, "a: " + "{a: " * 3000 + "1" + "}" * 3000,
        ("a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
        "d: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d]\n"
        "balance: {batch_sizes: [*e, *e, *e, *e, *e, *e, *e, *e]}\n"),
        "balance: 0\n", "0\n", "false\n", "[]\n", "''\n", "!!python/object:os.system 'true'\n",
        "? [1, 2]\n: 3\n", "{1: a, balance: {}}\n", "balance:\n  seed: 2020-01-01\n", "compression: .nan\n",
        "compression:\n  base_density: .inf\n", "\t: x\n", "balance: {batch_sizes: [3, 13]}\n",
    ])
    return st.one_of(shaped, shaped, weird, st.text(max_size=40)).flatmap(_mangle)


def _plain(data: Any) -> Any:
    """What safe_dump can write (tuples as lists, functions dropped)."""
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    return None if callable(data) else data


def _rank(r: int) -> dict[str, Any]:
    return {"rank": r, "device": {"name": "cpu"}, "training_dtype": "fp32", "matmul_tflops": {"fp32": 1.0},
            "compute_score": 1.0 / (r + 1), "bandwidth_gbit_s": 10.0 / (r + 1), "tier": TIERS[r % 4]}


def profile_documents() -> st.SearchStrategy[bytes]:
    """Cluster-profile JSON: missing fields, wrong schema versions, wrong types, wrong rank counts,
    NaN, truncated, empty and not-UTF-8 files."""
    from hetero_strategy.cluster.profile import SCHEMA

    rank_fields = ["rank", "compute_score", "bandwidth_gbit_s", "tier", "device", "training_dtype"]

    @st.composite
    def document(draw) -> str:
        n = draw(st.integers(0, 5))
        ranks: list[Any] = [_rank(r) for r in range(n)]
        for r in ranks:
            for name in draw(st.lists(st.sampled_from(rank_fields), unique=True, max_size=2)):
                if draw(st.booleans()):
                    r.pop(name)
                else:
                    r[name] = draw(ANY)
        if draw(st.integers(0, 9)) == 0:
            ranks = draw(ANY)
        data: Any = {"schema": draw(st.sampled_from([SCHEMA, SCHEMA, SCHEMA, "hetero_strategy.cluster_profile/2",
                                                    "hetero-profile/0"]) | TEXT | ANY),
                     "world_size": n, "ranks": ranks}
        if draw(st.integers(0, 9)) == 0:
            data = draw(ANY)
        return json.dumps(data, allow_nan=True, default=repr)

    deep = st.sampled_from(["[" * 100_000 + "]" * 100_000, '{"schema": ' * 5000 + "1" + "}" * 5000])
    return st.one_of(document(), document(), document(), deep, st.text(max_size=30)).flatmap(_mangle)


# ---- the property's checks -----------------------------------------------------------------
REFUSAL = re.compile(r"^(?P<field>[^=\n]+?)=(?P<value>.+?) is invalid: (?P<fix>.{8,})$", re.DOTALL)


def assert_clear(error: BaseException, names: list[str] | None = None) -> None:
    """``<field>=<value> is invalid: <what is allowed>`` on one line, of bounded length, naming one
    of ``names`` when given (as the field, or in the fix: ``plateau_thresholds=[0.05, 0.01] is
    invalid: give 3 threshold(s) ... (periods has 4)`` answers ``periods=[4, 1, 1, 1]``)."""
    message = str(error)
    assert "\n" not in message, f"more than one line: {message!r}"
    assert len(message) < 2000, f"a {len(message)}-character message"
    m = REFUSAL.match(message)
    assert m, f"does not name field, value and fix: {message!r}"
    if names:
        assert any(n in m["field"] or n in m["fix"] for n in names), f"names none of {names}: {message!r}"


def assert_finite(value: Any, where: str = "config") -> None:
    """An accepted config holds no NaN or infinity anywhere (a NaN compares false with every bound)."""
    if isinstance(value, float):
        assert math.isfinite(value), f"{where}={value!r} was accepted"
    elif isinstance(value, dict):
        for k, v in value.items():
            assert_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            assert_finite(v, f"{where}[{i}]")


Call = Callable[[], Any]
