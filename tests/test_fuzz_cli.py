"""Fuzzing every command's argument list (issue 31), built from the parser itself, so a command or
flag added later is fuzzed too: each generated ``argv`` is accepted, or refused with status 2 and
a message naming the flag or value; no traceback, no hang, no file left behind by a refusal.

Commands that would start ranks, namespaces or a profile are fuzzed up to their argument checks:
the first step of real work raises ``Started`` (an accepted input). An output path must have been
checked by then. Each ``@example`` is a case the fuzzer found.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import tempfile
from pathlib import Path

import pytest
from fuzz_inputs import FLOATS, FUZZ, INTS, TEXT, bounded
from hypothesis import example, given
from hypothesis import strategies as st

from hetero_strategy import cli


class Started(BaseException):
    """The command got past its argument checks and began real work."""


def _started(*_a, **_k):
    raise Started


@pytest.fixture(scope="module")
def no_work():
    """Every way a command starts work raises Started (module-wide: hypothesis reuses it)."""
    import subprocess

    import hetero_bench._ranks as ranks
    from hetero_bench import compression

    import hetero_strategy.accelerate.launch_config  # noqa: F401  (imported once here, not inside a timed case)
    from hetero_strategy.cluster import profile
    from hetero_strategy.emulate import cluster

    mp = pytest.MonkeyPatch()
    for target, name in [(cluster.EmulatedCluster, "start"), (cluster.EmulatedCluster, "__enter__"),
                         (ranks, "run_job"), (profile, "run_profile"), (compression, "_local"),
                         (compression, "_emulated"), (subprocess, "Popen"), (subprocess, "run")]:
        mp.setattr(target, name, _started)
    yield
    mp.undo()


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    out = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_parsers(sub, (*path, name)))
    return out


PARSERS = _parsers(cli.build_parser())
# In the sandbox (each case's cwd): good.yaml, bad.yaml, cluster.json, answers.yaml, sub/; and outside it
PATHS = st.sampled_from(["good.yaml", "bad.yaml", "cluster.json", "answers.yaml", "sub", "sub/x.json", "x.json", "x" * 300,
                         "missing/dir/x.json", "missing.yaml", "/proc/nonexistent/x.json", "/dev/null/x.json",
                         "/proc/version", ".", "", "not\x00a path"])
NUMBERS = st.one_of(INTS.map(str), FLOATS.map(repr), st.sampled_from(["nan", "inf", "-1", "0", "1e400", "0x10",
                                                                      " 1 ", "1_000", "١", "1,2", "3,1"]))
LISTS = st.lists(NUMBERS | st.sampled_from(["10gbit", "1gbit", "100mbit", "none", "4G", "x", ""]),
                 min_size=0, max_size=5).map(",".join)


def _value(action: argparse.Action) -> st.SearchStrategy[str]:
    strategies = [TEXT, NUMBERS, LISTS, PATHS]
    if action.choices:
        strategies += [st.sampled_from([str(c) for c in action.choices])] * 3
    if isinstance(action.default, str):
        strategies += [st.just(action.default)] * 2
    if any(word in action.dest for word in ("json", "out", "dir", "file", "answers", "profile", "config")):
        strategies += [PATHS] * 3
    return st.one_of(strategies)


@st.composite
def argv(draw) -> list[str]:
    path = draw(st.sampled_from(sorted(PARSERS)))
    parser = PARSERS[path]
    args = list(path)
    options = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    for action in draw(st.lists(st.sampled_from(options), max_size=5)) if options else []:
        args.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs == 0:
            continue
        many = action.nargs in ("+", "*") or isinstance(action.nargs, int)
        for _ in range(draw(st.integers(0, 3)) if many else draw(st.sampled_from([1, 1, 1, 1, 0]))):
            args.append(draw(_value(action)))
    for action in parser._actions:
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            if action.nargs == argparse.REMAINDER:
                args += draw(st.sampled_from([[], ["--", "true"], ["true"]]))
            elif draw(st.integers(0, 4)):
                args.append(draw(PATHS))
    if draw(st.integers(0, 9)) == 0:
        args.insert(draw(st.integers(0, len(args))), draw(st.sampled_from(["--bogus", "-x", "--", "extra"]) | TEXT))
    return args


def _sandbox(root: Path) -> None:
    (root / "sub").mkdir()
    (root / "good.yaml").write_text("compression:\n  method: topk\n")
    (root / "bad.yaml").write_text("compression:\n  method: zip\n")
    (root / "answers.yaml").write_text("device: cpu\nnum_processes: 2\n")
    (root / "cluster.json").write_text(
        '{"schema": "hetero_strategy.cluster_profile/1", "world_size": 2, "ranks": ['
        '{"rank": 0, "compute_score": 1.0, "bandwidth_gbit_s": 10.0, "tier": "eth10g"},'
        '{"rank": 1, "compute_score": 0.5, "bandwidth_gbit_s": 1.0, "tier": "eth1g"}]}')


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _writable_output(text: str, root: Path) -> bool:
    path = root / text
    return bool(text) and "\x00" not in text and path.parent.is_dir() and not path.is_dir()


def _run(args: list[str]) -> tuple[str, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main(args)
        except SystemExit as e:
            code = e.code
        except Started:
            code = "started"
    return str(code), out.getvalue()


@FUZZ
@given(args=argv())
@example(args=["profile", "--json", "/proc/nonexistent/x.json"])  # profiled first, then FileNotFoundError
@example(args=["profile", "--json", "missing/dir/x.json"])
@example(args=["bench", "balance", "--json", "/dev/null/x.json"])  # accepted: benchmarked, then failed to write
@example(args=["bench", "hybrid", "--compute", "1.0"])  # was: too many values to unpack (fixed in c90fff6)
@example(args=["bench", "soak", "--compute", "1.0"])  # was: too many values to unpack (fixed in c90fff6)
@example(args=["bench", "overlap", "--json", "/dev/null/x.json"])  # FileExistsError from mkdir
@example(args=["bench", "compression-scaling", "--link", "x"])  # ValueError from ClusterSpec
@example(args=["config", "--defaults", "--output-dir", "/dev/null/x"])  # NotADirectoryError from mkdir
@example(args=["config", "--defaults", "--hetero-file", "sub"])  # IsADirectoryError after accelerate.yaml
@example(args=["profile", "--max-bytes", "inf"])  # OverflowError from int(inf)
@example(args=["emulate", "--memory", "inf", "--", "true"])  # OverflowError from int(inf)
@example(args=["emulate", "--json", "sub", "--", "true"])  # accepted: ran the job, then IsADirectoryError
@example(args=["bench", "balance", "--json", "x" * 300])  # a name too long
@example(args=["bench", "accelerate", ""])
@example(args=["emulate", "--nodes", "9223372036854775808", "--", "true"])
@example(args=["emulate", "--nproc", "9223372036854775808", "--", "true"])  # OverflowError: [1.0] * n
@example(args=["bench", "compression", "--json", "0", "--from-json", "7.0"])  # FileNotFoundError
@example(args=["bench", "compression", "--from-json", "cluster.json"])  # KeyError: no stored result
@example(args=["bench", "overlap", "--mtu", "9223372036854775808"])  # ValueError from ClusterSpec: no upper bound
@example(args=["emulate", "--mtu", "9001", "--", "true"])
@example(args=["config", "--output-dir", "7.0", "--"])
@example(args=["\x1f"])  # argparse shows it as '\x1f'
def test_every_argument_list_is_accepted_or_refused_with_status_2(no_work, args):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _sandbox(root)
        before, cwd = _files(root), os.getcwd()
        os.chdir(root)
        try:
            with bounded():
                code, text = _run(args)
        finally:
            os.chdir(cwd)
        assert "Traceback" not in text, text
        assert code in ("0", "2", "started"), f"exit {code}: {text[-2000:]}"
        if code == "2":
            assert text.strip(), "refused without a word"
            tokens = [t for a in args for t in (a, repr(a), a.strip(" -"))
                      if t.strip(" -") or len(t.strip()) > 1] or ["hetero-strategy"]  # "--" too, not "-"
            # NOTE: argparse cannot show an empty argument: "unrecognized arguments: " names it by its absence
            empty = "" in args and "unrecognized arguments" in text
            assert any(t in text for t in tokens) or "required" in text or empty, text[-2000:]
            assert _files(root) == before, f"a refused command left {sorted(_files(root) - before)}"
        if code == "started":
            for flag, value in itertools.pairwise(args):
                if flag == "--json":  # --out and --output-dir are directories
                    assert _writable_output(value, root), f"{flag} {value!r} was not checked before the work"


@FUZZ
@given(text=NUMBERS | LISTS | TEXT | st.sampled_from(["infgbit", "nanmbit", "infmb", "1e400G", "inf", "-inf,1"]))
@example(text="infgbit")  # parse_rate: accepted an infinite rate
@example(text="infmb")  # parse_size: OverflowError from int(inf)
@example(text="inf")  # emulate's memory size: OverflowError; a latency of inf ms accepted
@example(text="nan,1")  # parse_float_list: accepted NaN
def test_the_flag_parsers_return_finite_values_or_refuse(text):
    """The parsers behind --link, --max-bytes, --memory, --latency and --compute (argparse shows
    what escapes a ``type=``, but a NaN or infinity that passes goes on to the emulator)."""
    import math

    from hetero_strategy.cluster.tiers import parse_rate, parse_size
    from hetero_strategy.emulate import spec

    parsers = {"--link": parse_rate, "--max-bytes": parse_size, "--memory": lambda t: spec.parse_size(t, "--memory"),
               "--latency": lambda t: spec.parse_float_list(t, "--latency")}
    for flag, parse in parsers.items():
        try:
            value = parse(text)
        except ValueError as e:
            assert "is invalid" in str(e), (flag, str(e))
            continue
        values = value if isinstance(value, list) else [value]
        assert all(v is None or math.isfinite(v) for v in values), (flag, text, value)
