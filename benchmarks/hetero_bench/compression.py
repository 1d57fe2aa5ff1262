"""``hetero-strategy bench compression``: dense fp32, fp16, PowerSGD, Top-K and tiered, in one run.

1. Step time and bytes per step: ResNet-18, batch 32 per rank, 2 ranks on the emulated cluster
   with 100 Mbit/s tbf links (namespaces; needs root), methods alternating step by step. Bytes
   are the hook's count and the rank's interface transmit counter (inside its namespace).
2. The same on an unthrottled link (loopback): what compression costs where it does not pay
   (``dense_fallback`` measures the link and the codec and sends densely there).
3. Time to accuracy, end to end, on the emulated link: a small CNN on sklearn digits trains with
   every method x seed in turn; the wall clock to the target held-out accuracy and the accuracy
   after the budget (:mod:`.compression_e2e`).

Writes JSON ``{"methods": {name: {step_time_s, unthrottled_step_time_s, accuracy,
time_to_target_s, ...}}, "ratios": {...}, "setup": {...}}`` and a PNG chart beside it. Times are
medians, with their spread (min, max) beside them.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench compression --json benchmarks/results/compression.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from hetero_bench import RESULTS
from hetero_bench._ranks import worker
from hetero_strategy.cluster.tiers import parse_rate
from hetero_strategy.commands.flags import UsageError, count, input_file, number, output_file, rate
from hetero_strategy.emulate.launch import die_with_parent

__all__ = ["add_arguments", "run"]

_WORKER = "compression_worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "compression.json"), help="where to write results")
    parser.add_argument("--link", type=rate, default="100mbit", help="slow link rate (step time and time to accuracy)")
    parser.add_argument("--ranks", type=int, choices=(2, 4), default=2,
                        help="2 ranks on --link, or 4 on bench balance's mixed cluster (hetero batch sizes)")
    parser.add_argument("--unthrottled", action="store_true", help="2 ranks on loopback: no link limit")
    parser.add_argument("--rounds", type=count(0), default=5,
                        help="ResNet-18 timed steps per method (alternating; 2 ranks; 0 skips them)")
    parser.add_argument("--steps", type=count(1), default=2000, help="time-to-accuracy step budget")
    parser.add_argument("--eval-every", type=count(1), default=25, help="held-out evaluation every N steps")
    parser.add_argument("--batch", type=count(1), default=32, help="mean batch per rank")
    parser.add_argument("--seeds", type=count(1), default=3, help="time-to-accuracy seeds")
    parser.add_argument("--target", type=number(0.0, 1.0, what="an accuracy"), default=0.95, help="digits held-out accuracy to reach")
    parser.add_argument("--lr", type=number(what="a learning rate"), default=0.003, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--from-json", type=input_file, default=None,
                        help="re-summarise a stored result at --target from its curves (no training)")
    parser.add_argument("--timeout", type=number(1.0, what="seconds"), default=7200.0, help="time-to-accuracy limit")
    parser.add_argument("--methods", nargs="+", default=None, help="a subset of the methods (default: all)")
    parser.add_argument("--simulate-link", action="store_true",
                        help="no namespaces: slow-link time = unthrottled compute + the hook's bytes / link rate "
                             "(labelled as computed in the JSON; compression is then forced on)")


def _local(args: list[str], timeout: float, env: dict[str, str] | None = None,
           argv: list[str] | None = None) -> None:
    """Two ranks of the worker command ``argv`` (default: this bench's) on loopback (unshaped)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [*(argv or worker(_WORKER)), *args]  # NOTE: first: worker() puts benchmarks/ on PYTHONPATH
    procs = []
    for r in range(2):
        e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE="2",
                 LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        e.pop("HETERO_TIER", None)
        e.update(env or {})
        procs.append(subprocess.Popen(cmd, env=e, preexec_fn=die_with_parent))  # noqa: PLW1509
    try:
        for p in procs:
            if p.wait(timeout=timeout) != 0:
                raise RuntimeError(f"bench worker failed with exit code {p.returncode}: {' '.join(args)}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _emulated(args: list[str], compute: list[float], links: list[str], timeout: float) -> None:
    from hetero_strategy.emulate import EmulatedCluster

    with EmulatedCluster(compute=compute, links=links) as cluster:
        result = cluster.run([*worker(_WORKER), *args], timeout=timeout)
    if not result.ok:
        raise RuntimeError(f"emulated bench failed (rc {result.returncode}):\n" + "\n".join(result.outputs)[-3000:])


MIXED = {"compute": [0.5, 0.45, 0.3, 0.25], "links": ["10gbit", "10gbit", "1gbit", "100mbit"]}  # bench balance's


def run(args: argparse.Namespace) -> int:
    from hetero_bench.compression_summary import chart, goals, ratios, retarget, summarise
    from hetero_bench.compression_worker import ALIASES, METHODS

    if args.from_json:
        return _retarget(args, retarget, ratios, goals, chart)

    picked = [ALIASES.get(m, m) for m in args.methods or METHODS]
    unknown = [m for m in picked if m not in METHODS]
    if unknown or "ddp" not in picked:
        print(f"bench compression: --methods={' '.join(args.methods or ())!r} is invalid: "
              f"{f'{unknown[0]!r} is unknown; ' if unknown else ''}choose from {', '.join(METHODS)}, "
              "including ddp (every ratio is against it)", file=sys.stderr)
        return 2
    if args.ranks == 4 and (args.unthrottled or args.simulate_link):
        print("bench compression: --ranks 4 runs bench balance's mixed cluster (emulated links); "
              "drop --unthrottled/--simulate-link", file=sys.stderr)
        return 2
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    methods_arg = ["--methods", *picked]
    conv_args = ["--steps", str(args.steps), "--seeds", str(args.seeds), "--target", str(args.target),
                 "--lr", str(args.lr), "--eval-every", str(args.eval_every), "--batch", str(args.batch), *methods_arg]
    if args.ranks == 4:
        compute, links = MIXED["compute"], MIXED["links"]
        conv_args.append("--hetero-batches")
    else:
        compute, links = [1.0, 1.0], [args.link, args.link]
    slow_r = fast_r = None
    with tempfile.TemporaryDirectory() as tmp:
        slow, fast, conv = (os.path.join(tmp, f) for f in ("slow.json", "fast.json", "conv.json"))
        if args.rounds and args.ranks == 2:  # ResNet-18 step times, methods alternating step by step
            print("bench compression: unthrottled step time (loopback) ...", flush=True)
            _local(["steptime", "--out", fast, "--rounds", str(args.rounds), *methods_arg], timeout=1800)
            fast_r = json.loads(Path(fast).read_text())
            if not (args.simulate_link or args.unthrottled):
                print(f"bench compression: step time on {args.link} (emulated namespaces) ...", flush=True)
                _emulated(["steptime", "--out", slow, "--rounds", str(args.rounds), *methods_arg], compute, links,
                          timeout=1800)
                slow_r = json.loads(Path(slow).read_text())
        where = "loopback" if args.unthrottled else f"{','.join(links)} (emulated namespaces)"
        print(f"bench compression: time to accuracy, {args.ranks} ranks, {where} ...", flush=True)
        if args.simulate_link:
            _local(["converge", "--out", conv, *conv_args, "--no-fallback", "--charge-link",
                    str(parse_rate(args.link))], timeout=args.timeout, env={"HETERO_TIER": "eth1g"})
        elif args.unthrottled:
            _local(["converge", "--out", conv, *conv_args], timeout=args.timeout)
        else:
            _emulated(["converge", "--out", conv, *conv_args], compute, links, timeout=args.timeout)
        conv_r = json.loads(Path(conv).read_text())
    methods = summarise(conv_r, slow_r or fast_r, fast_r)
    r = ratios(methods)
    setup = conv_r["_setup"]
    dense_step = methods["ddp"]["e2e_step_time_s"]
    result = {
        "methods": methods,
        "ratios": r,
        "goals": goals(methods, r, args.ranks, args.unthrottled),
        "setup": {
            "ranks": args.ranks, "compute": compute, "links": "loopback" if args.unthrottled else links,
            "link": "loopback" if args.unthrottled else args.link,
            "slow_link_timing": "computed: unthrottled step + bytes/rate" if args.simulate_link
            else "loopback (unthrottled)" if args.unthrottled else "measured on emulated tbf links (network namespaces)",
            "batch_sizes": {"ddp methods": setup["equal_batch_sizes"], "hetero methods": setup["hetero_batch_sizes"]},
            "compute_step_s": setup["compute_step_s"],
            # the dense step's communication share: what the slowest rank's compute leaves of it
            "dense_comm_fraction": 1.0 - max(setup["compute_step_s"]) / dense_step,
            "steptime_model": "torchvision resnet18, 32x32, batch 32/rank, 2 ranks, 1 CPU thread each; "
                              "topk: base_density 0.01 constant, 1 dense warm-up step" if args.rounds else None,
            "convergence": f"CNN 283k parameters on sklearn digits, SGD lr {args.lr} momentum 0.9, batch "
                           f"{args.batch}/rank mean, {args.steps} steps, {args.seeds} seeds (methods alternate "
                           f"within each seed), target {args.target}, evaluated every {args.eval_every} steps; "
                           "topk/topk_allreduce at density 0.01 constant, tiered and auto with the config defaults",
            "rounds": args.rounds,
            "statistics": "times are medians over seeds; *_spread are [min, max]; ratios are of medians",
        },
    }
    out.write_text(json.dumps(result, indent=2))
    chart(methods, out.with_suffix(".png"), f"bench compression: {args.ranks} ranks, {where}, target {args.target}")
    _print(methods, r, result["goals"])
    return 0


def _retarget(args: argparse.Namespace, retarget, ratios, goals, chart) -> int:
    """``--from-json``: the stored run read at ``--target``, written to ``--json`` (its setup says so)."""
    try:  # NOTE: the one read of a stored result; bench's run() prints a UsageError and exits 2
        stored = json.loads(Path(args.from_json).read_bytes())
        stored_methods, setup = stored["methods"], stored["setup"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError) as e:
        raise UsageError(f"--from-json={args.from_json!r} is invalid: not a stored `bench compression` result "
                         f"({type(e).__name__}); give the --json of an earlier run") from None
    methods = retarget(stored_methods, args.target)
    r = ratios(methods)
    unthrottled = setup.get("links") == "loopback"
    result = {"methods": methods, "ratios": r, "goals": goals(methods, r, setup["ranks"], unthrottled),
              "setup": {**setup, "target": args.target,
                        "retargeted_from": f"{args.from_json} (the same run's curves, read at target {args.target})"}}
    out = Path(args.json)
    out.write_text(json.dumps(result, indent=2))
    chart(methods, out.with_suffix(".png"), f"bench compression: {setup['ranks']} ranks, target {args.target}")
    _print(methods, r, result["goals"])
    return 0


def _print(methods: dict, ratios: dict, goals: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bench compression")
    for col in ("method", "ranks", "kB/step (wire)", "step s", "accuracy", "steps→target", "time→target s [min, max]"):
        table.add_column(col)
    for m, v in methods.items():
        spread = v["time_to_target_spread_s"]
        table.add_row(m, str(v["world_size"]), f"{v['wire_bytes_per_step'] / 1e3:.1f}", f"{v['e2e_step_time_s']:.3f}",
                      f"{v['accuracy']:.3f}", str(v["steps_to_target"]),
                      "-" if v["time_to_target_s"] is None
                      else f"{v['time_to_target_s']:.1f} [{spread[0]:.1f}, {spread[1]:.1f}]")
    console = Console()
    console.print(table)
    console.print({k: round(v, 3) if isinstance(v, float) else v for k, v in ratios.items()})
    console.print(goals)
