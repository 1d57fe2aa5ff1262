"""``hetero-strategy bench plan``: the planner's predictions checked against the emulator.

On each of the emulated clusters that ``bench balance`` and ``bench compression`` run:

* ``2rank_compute`` — 2 ranks, 1.0 / 0.57 of a core, 10 Gbit/s; bench balance's ResNet-18;
* ``4rank_mixed`` — 4 ranks, 0.5 / 0.45 / 0.3 / 0.25 of a core on 10 Gbit/s, 10 Gbit/s, 1 Gbit/s and
  100 Mbit/s (bench balance's mixed cluster), ResNet-18 without layer4;
* ``2rank_100mbit`` — 2 full-core ranks on 100 Mbit/s with each codec (bench compression's step
  time: dense, fp16, PowerSGD rank 4, Top-K 1% all-gather and all-reduce),

it runs ``--rounds`` rounds, each of which (1) runs ``hetero-strategy profile --model`` inside
that cluster, (2) predicts every method with ``hetero-strategy plan``'s code from that profile
alone, and (3) measures the methods with the benchmarks' own workers (``balance_worker
--framework ddp``, ``compression_worker steptime``), in alternating order. A method's prediction
is the median over rounds, as is its measurement. Figures and errors: :mod:`.plan_summary`.

``hetero`` and ``hetero_auto`` run at the split the plan gives them (``batch_sizes=``, as a user
applies ``plan``'s answer), so their error is the step-time model's; how near the runtime's own
start-up probe lands to a good split is ``bench balance``'s question (it measured splits from
[41, 23] to [56, 8] for the plan's [52, 12] here). ``hetero_auto``'s codec is still the one the
run's ``compression="auto"`` picks.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench plan --json benchmarks/results/plan.json
    hetero-strategy bench plan --configs 2rank_100mbit --rounds 3      # one configuration
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetero_bench import RESULTS
from hetero_bench._ranks import run_job, worker
from hetero_strategy.commands.flags import count, input_file, number, output_file

__all__ = ["CONFIGS", "add_arguments", "run"]

_BALANCE = {"ddp": "ddp", "ddp_powersgd": "ddp_powersgd", "hetero": "hetero", "hetero_auto": "hetero_codec"}
_CODECS = {"ddp": "dense", "ddp_fp16": "fp16", "ddp_powersgd": "powersgd", "topk": "topk",
           "topk_allreduce": "topk_allreduce"}  # compression_worker's method -> the codec predicted
CONFIGS: dict[str, dict[str, Any]] = {
    "2rank_compute": {"compute": [1.0, 0.57], "links": ["10gbit", "10gbit"], "worker": "balance",
                      "model": "resnet18", "spec": "hetero_bench.plan_models:balance_resnet18"},
    "4rank_mixed": {"compute": [0.5, 0.45, 0.3, 0.25], "links": ["10gbit", "10gbit", "1gbit", "100mbit"],
                    "worker": "balance", "model": "resnet18_l3", "spec": "hetero_bench.plan_models:balance_resnet18_l3"},
    "2rank_100mbit": {"compute": [1.0, 1.0], "links": ["100mbit", "100mbit"], "worker": "codecs",
                      "spec": "hetero_bench.plan_models:compression_resnet18"},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "plan.json"), help="result JSON (PNG beside it)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--batch", type=count(2), default=32, help="mean per-rank batch (default 32)")
    # NOTE: 5, as every benchmark here: one round's step moved 0.29-0.39 s for DDP on 2rank_compute
    # within a run of 3 (f545766), and a median of 3 such is a draw at the 15% goal
    parser.add_argument("--rounds", type=count(1), default=5,
                        help="rounds, each a profile then the methods (default 5): the balance configurations run each "
                             "method once per round, in alternating order; the codec one 4 blocks of 3 steps per "
                             "method, methods alternating (the mean of the last 2 steps of a block)")
    parser.add_argument("--steps", type=count(4), default=12, help="training steps per method and round")
    parser.add_argument("--measure", type=count(2), default=6, help="figures use the last N steps")
    parser.add_argument("--profile-bytes", default="16MB", help="largest all-reduce of the profile's sweep")
    parser.add_argument("--timeout", type=number(what="seconds"), default=600.0, help="seconds allowed per launch")
    parser.add_argument("--from-json", type=input_file, default=None,
                        help="no run: predict again from a stored result's profiles, against its measurements")


def _profile(cluster: Any, spec: str, args: argparse.Namespace, out: Path, console: Any) -> Path:
    """``hetero-strategy profile --model`` on every rank of ``cluster``; the profile's path."""
    path = out / "profile.json"
    cmd = [worker("plan_models")[0], "-m", "hetero_strategy.cli", "profile", "--max-bytes", args.profile_bytes,
           "--model", spec, "--model-batch", str(args.batch), "--budget", "0.2", "--json", str(path)]
    started = time.perf_counter()
    res = cluster.run(cmd, timeout=args.timeout)
    if not res.ok:
        raise RuntimeError("profile failed:\n" + "\n".join(o[-2000:] for o in res.outputs))
    console.print(f"  profile: {time.perf_counter() - started:.1f} s")
    return path


def _predict(profile: Path, config: dict[str, Any], world: int, batch: int) -> dict[str, dict[str, Any]]:
    from dataclasses import asdict

    from hetero_strategy.balance.plan import plan_methods, predict
    from hetero_strategy.cluster.model import describe_model
    from hetero_strategy.cluster.spec import read_cluster

    cluster, model = read_cluster([str(profile)]), describe_model(config["spec"])
    if config["worker"] == "balance":
        got = {m: asdict(p) for m, p in plan_methods(cluster, model, batch * world).items()}
    else:
        got = {m: asdict(predict(cluster, model, batch * world, codec)) for m, codec in _CODECS.items()}
    return got


def _measure_balance(cluster: Any, config: dict[str, Any], args: argparse.Namespace, i: int, out: Path,
                     console: Any, planned: dict[str, dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Round ``i``: every method once in one launch, hetero and hetero_auto at this round's plan."""
    from hetero_bench.plan_summary import balance_round

    modes = list(_BALANCE.values())
    at_plan = [f"{_BALANCE[m]}={','.join(map(str, planned[m]['batch_sizes']))}" for m in ("hetero", "hetero_auto")]
    order = modes if i % 2 == 0 else modes[::-1]  # drift in the machine's load favours no method
    cmd = [*worker("balance_worker"), "--framework", "ddp", "--mode", ",".join(order), "--count-bytes",
           "--out", str(out), "--batch", str(args.batch), "--steps", str(args.steps),
           "--measure", str(args.measure), "--model", config["model"],
           *(a for sizes in at_plan for a in ("--plan-sizes", sizes))]
    raw = run_job(cluster, cmd, order, out, args.timeout * len(order), console, f"round {i + 1}")
    got = balance_round(raw, args.measure)
    return {method: {key: [got[mode][key]] for key in ("step_s", "bytes_per_rank", "batch_sizes", "codec")}
            for method, mode in _BALANCE.items()}


def _measure_codecs(cluster: Any, args: argparse.Namespace, out: Path, console: Any) -> dict[str, dict[str, list]]:
    """One round: 4 rounds of the codecs' alternating blocks in one launch."""
    from hetero_bench.plan_summary import codec_rounds

    path = out / "steptime.json"
    cmd = [*worker("compression_worker"), "steptime", "--out", str(path), "--rounds", "4",
           "--block", "3", "--methods", *_CODECS]
    started = time.perf_counter()
    res = cluster.run(cmd, timeout=args.timeout)
    if not res.ok:
        raise RuntimeError("steptime failed:\n" + "\n".join(o[-2000:] for o in res.outputs))
    console.print(f"  steptime: {time.perf_counter() - started:.1f} s")
    return codec_rounds(json.loads(path.read_text()), list(_CODECS))


def _measure(name: str, args: argparse.Namespace, console: Any) -> dict[str, Any]:
    """One configuration on its emulated cluster, in rounds: each round profiles the cluster, then
    measures each method's step time and bytes per rank (the balance methods at that profile's plan)."""
    from hetero_strategy.emulate import EmulatedCluster

    config = CONFIGS[name]
    console.print(f"[bold]{name}[/bold]: compute {config['compute']}, links {config['links']}")
    profiles: list[dict] = []
    measured: dict[str, dict[str, list]] = {}
    with EmulatedCluster(config["compute"], config["links"]) as cluster, \
            tempfile.TemporaryDirectory(prefix="bench_plan_") as tmp:
        for i in range(args.rounds):
            # NOTE: a profile per round, just before what it predicts: this host's speed moves by
            # 2-15% within seconds and its noise level from minute to minute (docs/benchmarks.md); one
            # profile at the start made every later round a prediction for another machine
            out = Path(tmp, f"round{i}")
            out.mkdir()
            profile = _profile(cluster, config["spec"], args, out, console)
            profiles.append(json.loads(profile.read_text()))
            if config["worker"] == "balance":
                planned = _predict(profile, config, len(config["compute"]), args.batch)
                got = _measure_balance(cluster, config, args, i, out / "runs", console, planned)
            else:
                got = _measure_codecs(cluster, args, out, console)
            for method, figures in got.items():
                for key, values in figures.items():
                    measured.setdefault(method, {}).setdefault(key, []).extend(values)
        return {"profiles": profiles, "measured_rounds": measured, "cluster": cluster.describe()}


def _assess(name: str, raw: dict[str, Any], batch: int) -> dict[str, Any]:
    """Predict each round from its profile alone (the median over rounds), and compare with what was
    measured. A result stored before profiles were per round has one ``profile``."""
    from hetero_bench.plan_summary import combine_rounds, compare

    config = CONFIGS[name]
    world = len(config["compute"])
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as tmp:
        for i, profile in enumerate(raw.get("profiles") or [raw["profile"]]):
            path = Path(tmp, f"profile{i}.json")
            path.write_text(json.dumps(profile))
            rounds.append(_predict(path, config, world, batch))
    result = compare(combine_rounds(rounds), raw["measured_rounds"])
    for m, v in result["methods"].items():
        v["measured_batch_sizes"] = raw["measured_rounds"][m].get("batch_sizes")
        v["measured_codec"] = raw["measured_rounds"][m].get("codec")  # compression="auto"'s choice in the run
    return {**result, "compute": config["compute"], "links": config["links"], "model": config["spec"],
            "global_batch": batch * world, **raw}


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_bench.plan_summary import summarise
    from hetero_strategy.commands.flags import UsageError
    from hetero_strategy.emulate import EmulatorError

    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not names or any(n not in CONFIGS for n in names) or args.measure >= args.steps:
        raise UsageError(f"--configs={args.configs!r} / --measure={args.measure}: give names from "
                         f"{', '.join(CONFIGS)}, and --measure below --steps ({args.steps})")
    console = Console()
    started = time.perf_counter()
    measured_commit = None
    if args.from_json:  # the stored run's profiles and measurements, predicted by this checkout's planner
        doc = json.loads(Path(args.from_json).read_text())
        measured_commit = doc.get("measured_commit") or doc.get("commit")
        stored, args.batch = doc["configs"], doc["setup"]["batch_per_rank"]
        raws = {n: {k: stored[n][k] for k in ("profile", "profiles", "measured_rounds", "cluster") if k in stored[n]}
                for n in names if n in stored}
    else:
        raws = {}
        for n in names:
            try:
                raws[n] = _measure(n, args, console)
            except (EmulatorError, RuntimeError) as e:  # NOTE: the other configurations still count
                console.print(f"bench plan: {n}: {e}", markup=False, highlight=False)
    if not raws:
        return 1
    configs = {n: _assess(n, raw, args.batch) for n, raw in raws.items()}
    result = summarise(configs)
    from hetero_strategy.commands.provenance import source_commit

    commit = source_commit()
    result.update(wall_s=time.perf_counter() - started, command=" ".join(sys.argv), commit=commit,
                  measured_commit=measured_commit or commit,  # --from-json: the stored run's
                  missing=[n for n in names if n not in raws],
                  setup={"batch_per_rank": args.batch, "rounds": args.rounds, "steps": args.steps,
                         "measure_last": args.measure, "profile_max_bytes": args.profile_bytes,
                         "hetero_split": "the plan's (batch_sizes=); hetero_auto's codec: the run's compression=auto",
                         "statistics": "predicted: each round from the profile measured at its start (a result stored "
                                       "before that: its one profile), the median over rounds; "
                                       "step: median over rounds of each round's median step (codecs: of the "
                                       "mean of the last 2 steps of each 3-step block, methods alternating); spread [min, max]; error = predicted/measured - 1"})
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    from hetero_bench.plan_chart import plan_chart, plan_table

    plan_chart(result, str(path.with_suffix(".png")))
    console.print(plan_table(result))
    console.print(f"goals: {result['goals']}; wrote {path} and {path.with_suffix('.png')}")
    return 0
