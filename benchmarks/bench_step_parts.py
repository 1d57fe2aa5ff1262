"""Where a bare-DDP step's time goes on the emulated ``2rank_compute`` cluster (1.0 / 0.57 of a
core, 10 Gbit/s; bench balance's ResNet-18 on digits at 32 samples per rank).

Each rank runs, in turns of 3 timed steps (one untimed before), order reversed every other turn:

* ``bare``: forward, backward and SGD on the module alone (no exchange);
* ``ddp``: the same under DDP (dense, default buckets);
* ``allreduce``: one all-reduce of the gradient's size, nothing else;

and records each step's wall and CPU seconds (CPU: this process, every thread). Per rank:
``exchange_cpu_s`` = DDP's CPU less bare's (medians), against ``allreduce_cpu_s`` = the all-reduce
alone: how much more the exchange costs a core when it runs beside backward than alone
(``exchange_over_allreduce``). The profile's ``model_step.exchange_cpu_s`` measures the first
(docs/planner.md); this shows it beside the second on the same cluster.

Example::

    flock /tmp/hetero_cpu.lock .venv/bin/python benchmarks/bench_step_parts.py \\
        --json benchmarks/results/step_parts.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

_PHASES = ("bare", "ddp", "allreduce")


def _worker(out: str, batch: int, turns: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from hetero_bench.balance_workload import bench_model, train_data
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = bench_model("resnet18")
    x, y = (t[:batch].clone() for t in train_data(batch, dist.get_world_size(), 1).tensors)
    ddp = DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    flat = torch.zeros(sum(p.numel() for p in net.parameters()))

    def step(model: nn.Module) -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    run = {"bare": lambda: step(net), "ddp": lambda: step(ddp), "allreduce": lambda: dist.all_reduce(flat)}
    wall: dict[str, list[float]] = {k: [] for k in _PHASES}
    cpu: dict[str, list[float]] = {k: [] for k in _PHASES}
    for turn in range(turns):
        for k in _PHASES if turn % 2 == 0 else _PHASES[::-1]:
            dist.barrier()
            run[k]()  # untimed: the first step after another phase warms its caches
            for _ in range(3):
                t0, c0 = time.perf_counter(), time.process_time()
                run[k]()
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
    Path(f"{out}.{rank}.json").write_text(json.dumps({"rank": rank, "wall_s": wall, "cpu_s": cpu}))
    dist.barrier()
    os._exit(0)  # NOTE: results are saved; skip finalization (docs/troubleshooting.md: exit aborts)


def _summary(ranks: list[dict]) -> list[dict]:
    out = []
    for r in ranks:
        med = {k: {"wall_s": statistics.median(r["wall_s"][k]), "cpu_s": statistics.median(r["cpu_s"][k])}
               for k in _PHASES}
        exchange = med["ddp"]["cpu_s"] - med["bare"]["cpu_s"]
        out.append({"rank": r["rank"], "phases": med, "exchange_cpu_s": exchange,
                    "allreduce_cpu_s": med["allreduce"]["cpu_s"],
                    "exchange_over_allreduce": exchange / med["allreduce"]["cpu_s"]})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="benchmarks/results/step_parts.json")
    parser.add_argument("--rounds", type=int, default=3, help="launches, each with --turns turns")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.batch, args.turns)
        return 0
    import tempfile

    from hetero_strategy.commands.provenance import source_commit
    from hetero_strategy.emulate import EmulatedCluster

    here = Path(__file__).resolve().parent
    env = {"PYTHONPATH": os.pathsep.join([str(here), str(here.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    rounds, started = [], time.perf_counter()
    with EmulatedCluster([1.0, 0.57], ["10gbit", "10gbit"]) as cluster, tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            stem = f"{tmp}/round{i}"
            res = cluster.run([sys.executable, __file__, "--worker", stem, "--batch", str(args.batch),
                               "--turns", str(args.turns)], timeout=600, env=env)
            if not res.ok:
                print("\n".join(o[-3000:] for o in res.outputs))
                return 1
            rounds.append(_summary([json.loads(Path(f"{stem}.{k}.json").read_text()) for k in range(2)]))
            print(f"round {i + 1}: " + ", ".join(f"rank {r['rank']} exchange {r['exchange_cpu_s']:.3f} CPU s, "
                                                 f"all-reduce alone {r['allreduce_cpu_s']:.3f}" for r in rounds[-1]))
    result = {"rounds": rounds, "compute": [1.0, 0.57], "links": ["10gbit", "10gbit"], "batch_per_rank": args.batch,
              "commit": source_commit(), "command": " ".join(sys.argv), "wall_s": time.perf_counter() - started}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
