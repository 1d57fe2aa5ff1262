"""Fuzzing the cluster-profile JSON (issue 31): every generated file is read into sound planner
inputs, or refused with a ConfigError naming the file, the bad field or value and the fix; the
readers above it (the planner's bandwidth, the hook's tier) refuse a rank count that does not
match the job. Each ``@example`` is a case the fuzzer found."""

from __future__ import annotations

import json
import math

from fuzz_inputs import FUZZ, assert_clear, bounded, profile_documents
from hypothesis import example, given
from hypothesis import strategies as st

from hetero_strategy.cluster.profile import SCHEMA, load_profile
from hetero_strategy.config import TIERS, ConfigError
from hetero_strategy.runtime.planner import profile_bandwidth


def _doc(ranks: list, **top) -> bytes:
    return json.dumps({"schema": SCHEMA, "world_size": len(ranks) if isinstance(ranks, list) else 0,
                       "ranks": ranks, **top}).encode()


def _r(rank, compute=1.0, bw=10.0, tier="eth10g") -> dict:
    return {"rank": rank, "compute_score": compute, "bandwidth_gbit_s": bw, "tier": tier}


@FUZZ
@given(document=profile_documents(), world=st.integers(1, 5))
@example(document=b"\xff\xfe\x00{}", world=1)  # UnicodeDecodeError
@example(document=b"[" * 100_000 + b"]" * 100_000, world=1)  # RecursionError in json
@example(document=_doc([]), world=1)  # accepted: a profile of no rank
@example(document=_doc([_r(0, compute=math.nan)]), world=1)  # accepted: NaN compute
@example(document=_doc([_r(0, compute="inf")]), world=1)  # accepted: float("inf")
@example(document=_doc([_r(0, compute=-1.0)]), world=1)  # accepted: negative compute
@example(document=_doc([_r(0, bw=0.0), _r(1)]), world=2)  # accepted: a link of 0 Gbit/s
@example(document=_doc([_r(0, tier="wifi")]), world=1)  # accepted: an unknown tier
def test_profile_files_are_read_or_refused_clearly(tmp_path, document, world):
    path = tmp_path / "cluster.json"
    path.write_bytes(document)
    with bounded():
        try:
            inputs = load_profile(path)
        except ConfigError as e:
            assert_clear(e, ["profile"])
            assert str(path) in str(e)
            return
        n = len(inputs.compute)
        assert n >= 1 and len(inputs.bandwidth_gbit_s) == n and len(inputs.tiers) == n
        for x in (*inputs.compute, *inputs.bandwidth_gbit_s):
            assert isinstance(x, float) and math.isfinite(x) and x > 0, inputs
        assert all(t in TIERS for t in inputs.tiers), inputs.tiers
        try:
            assert len(profile_bandwidth(str(path), world)) == world
        except ConfigError as e:
            assert n != world, e
            assert_clear(e, ["profile"])
            assert f"describes {n} ranks but the job has {world}" in str(e)


def test_a_missing_empty_or_directory_profile_names_the_file(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    for path in (tmp_path / "missing.json", empty, tmp_path):
        try:
            load_profile(path)
        except ConfigError as e:
            assert_clear(e, ["profile"])
            assert str(path) in str(e)
        else:
            raise AssertionError(f"{path} was read as a profile")


def test_the_ranks_are_0_to_n_minus_1_once_each(tmp_path):
    """Rank numbers are how a profile's entries reach the job's ranks: a gap, a repeat or a bool
    would give one rank another's measurement."""
    path = tmp_path / "cluster.json"
    for ranks, needle in (([_r(0), _r(0)], "ranks[1].rank=0"), ([_r(0), _r(5)], "ranks[1].rank=5"),
                          ([_r(True)], "ranks[0].rank=True")):
        path.write_bytes(_doc(ranks))
        try:
            load_profile(path)
        except ConfigError as e:
            assert_clear(e, ["profile"])
            assert needle in str(e) and "each once" in str(e), str(e)
        else:
            raise AssertionError(f"{ranks} was read")
