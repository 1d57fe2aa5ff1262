"""How repeatable is the start-up probe's split? The probe (``balance.probe.probe_step_cost``) and the
static plan it gives (``runtime.planner.plan_batch_sizes``), run again and again on bench
balance's cluster (ranks at 1.0 and 0.57 of a core, 10 Gbit/s links, ResNet-18 on 32x32 digits, a
global batch of 128), in several launches, the arms taking turns within each launch:

* ``--steps``: timed windows per batch size (the probe's ``probe_steps``: 15 by default, 5 before);
* ``--exchange``: ``dense`` times backward beside a gradient-sized all-reduce (what the runtime does
  with ``overlap_comm=True``), ``none`` times compute alone (``overlap_comm=False``).

Why: a static split is only as good as the probe is repeatable; bench balance's static split moved
by up to 35 samples between rounds while its best swept split stayed within a few
(docs/benchmarks.md). Run alone, under the benchmarks' lock.

Example::

    flock /tmp/hetero_cpu.lock .venv/bin/python benchmarks/bench_probe_spread.py \\
        --json benchmarks/results/probe_spread.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_GLOBAL = 128


def _arms(args: argparse.Namespace) -> list[tuple[int, str]]:
    return [(s, e) for e in args.exchange.split(",") for s in (int(v) for v in args.steps.split(","))]


def _worker(args: argparse.Namespace) -> None:
    """One launch: every arm ``--reps`` times, in the order given; rank 0 writes the rows to ``--out``."""
    import torch
    import torch.distributed as dist

    from hetero_strategy.dist.exit_guard import exit_now

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    try:
        rows = _probes(args)
        if dist.get_rank() == 0:
            Path(args.out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()
    exit_now(0)  # results written; no finalization to abort in (docs/design.md, exit)


def _probes(args: argparse.Namespace) -> list[dict]:
    """The probes of one launch (collective: every rank runs the same arms), each planned as the
    runtime plans a static split (``runtime.planner.plan_batch_sizes``)."""
    import torch
    from hetero_bench.balance_workload import bench_model, train_data

    from hetero_strategy.balance.probe import ProbeExchange, probe_step_cost
    from hetero_strategy.config import BalanceConfig
    from hetero_strategy.runtime.planner import plan_batch_sizes

    torch.manual_seed(0)
    net, data = bench_model("resnet18"), train_data(_GLOBAL // 2, 2, 2)
    x = torch.stack([data[i][0] for i in range(_GLOBAL // 2)])
    y = torch.stack([data[i][1] for i in range(_GLOBAL // 2)])
    loss = torch.nn.CrossEntropyLoss()
    batches = [((x, y), len(y)), ((x[: len(y) // 2], y[: len(y) // 2]), len(y) // 2)]  # B and B/2, as the runtime
    rows = []
    for rep in range(args.reps):
        for steps, exchange in _arms(args):
            t0, costs = time.perf_counter(), []
            split = plan_batch_sizes(
                BalanceConfig(probe_steps=steps), 2, _GLOBAL,
                lambda steps=steps, exchange=exchange: probe_step_cost(
                    net, lambda b: loss(net(b[0]), b[1]), batches, steps, ProbeExchange(dense=exchange == "dense")),
                info=lambda _: None, on_costs=costs.extend)
            rows.append({"rep": rep, "steps": steps, "exchange": exchange, "split": split,
                         "costs": [[c.samples_per_s, c.fixed_s, c.spread] for c in costs],
                         "seconds": time.perf_counter() - t0})
    return rows


def _summary(rows: list[dict], arm: tuple[int, str]) -> dict:
    mine = [r for r in rows if (r["steps"], r["exchange"]) == arm]
    fast = [r["split"][0] for r in mine]
    return {"steps": arm[0], "exchange": arm[1], "fast_rank": fast, "median": statistics.median(fast),
            "min": min(fast), "max": max(fast), "sd": statistics.pstdev(fast),
            "probe_s": statistics.median(r["seconds"] for r in mine)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=3, help="launches of the 2-rank job (default 3)")
    p.add_argument("--reps", type=int, default=4, help="probes of each arm per launch (default 4)")
    p.add_argument("--steps", default="5,15", help="timed windows per batch size, one arm each (default 5,15)")
    p.add_argument("--exchange", default="dense", help="dense and/or none, one arm each (default dense)")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    steps = args.steps.split(",")
    if not all(v.isdigit() and int(v) >= 1 for v in steps) or len(set(steps)) != len(steps):
        p.error(f"--steps={args.steps!r} is invalid: give distinct whole numbers >= 1, e.g. 5,15")
    if not set(args.exchange.split(",")) <= {"dense", "none"} or args.launches < 1 or args.reps < 1:
        p.error("--exchange takes dense and/or none; --launches and --reps at least 1")
    sys.path[:0] = [str(_HERE.parent / "src"), str(_HERE)]
    from hetero_strategy.emulate import EmulatedCluster

    env = {"PYTHONPATH": os.pathsep.join([str(_HERE.parent / "src"), str(_HERE)])}
    launches, started = [], time.perf_counter()
    # generous: one probe of this model takes about 10 s plus 1 s per window on the slow rank
    timeout = 120 + 3 * args.reps * sum(10 + s for s, _ in _arms(args))
    with EmulatedCluster([1.0, 0.57], ["10gbit", "10gbit"]) as cluster, \
            tempfile.TemporaryDirectory(prefix="probe_spread_") as tmp:
        for k in range(args.launches):
            out = Path(tmp, f"launch{k}.json")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--out", str(out),
                   "--reps", str(args.reps), "--steps", args.steps, "--exchange", args.exchange]
            res = cluster.run(cmd, timeout=timeout, env=env)
            if not res.ok:
                print("\n".join(o[-2500:] for o in res.outputs), file=sys.stderr)
                return 1
            launches.append(json.loads(out.read_text()))
            print(f"launch {k + 1}/{args.launches}: " + ", ".join(
                f"{r['steps']}/{r['exchange']} {r['split'][0]}" for r in launches[-1]), flush=True)
    rows = [r for launch in launches for r in launch]
    commit = subprocess.run(["git", "-C", str(_HERE), "describe", "--always", "--dirty"], check=False,
                            capture_output=True, text=True).stdout.strip()
    result = {"benchmark": "probe_spread", "global_batch": _GLOBAL, "cluster": {"compute": [1.0, 0.57],
              "link": "10gbit", "model": "resnet18"}, "arms": [_summary(rows, a) for a in _arms(args)],
              "launches": launches, "wall_s": time.perf_counter() - started, "commit": commit,
              "command": " ".join(sys.argv)}
    for arm in result["arms"]:
        print(f"steps {arm['steps']}, {arm['exchange']}: fast rank median {arm['median']} "
              f"({arm['min']}-{arm['max']}, sd {arm['sd']:.1f}), probe {arm['probe_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
