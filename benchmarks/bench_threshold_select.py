"""Time exact Top-K selection against threshold reuse (``selection="threshold"``) on one tensor.

What the hook's codec runs per parameter, through the dispatcher (``--backend``, default torch):

* ``exact``: :func:`dispatch.topk_select_segments` (on the CPU the one-pass sampled select);
* ``reuse``: :func:`dispatch.threshold_select_segments` with a threshold estimated earlier (the
  step between re-estimates);
* ``estimate``: :func:`dispatch.segment_thresholds`, the exact k-th magnitude (the re-estimate);
* ``amortized``: ``reuse + estimate / every``, threshold selection's cost per step.

Rounds alternate exact and threshold within one run; each round's figure is the median of
``--reps`` calls on a fresh copy of the same accumulator (the copy is not timed). The JSON holds
per path the median over rounds and the min-max.

CPU:  ``flock /tmp/hetero_cpu.lock python benchmarks/bench_threshold_select.py --json benchmarks/results/threshold_select.json``
Check the setup only: ``python benchmarks/bench_threshold_select.py --dry-run``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
from hetero_strategy.triton_kernels import dispatch


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=1_000_000)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--headroom", type=float, default=1.25, help="payload slots per planned entry")
    p.add_argument("--every", type=int, default=10, help="threshold_every, for the amortized figure")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--backend", default="torch", choices=("torch", "triton", "auto"))
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the machine is shared)")
    p.add_argument("--json", metavar="PATH", default=None)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes, two rounds: checks the setup only")
    return p


def _time(fn, base: torch.Tensor, reps: int) -> float:
    """Median seconds of ``fn(copy of base)`` over ``reps`` calls (the copy is not timed)."""
    out = []
    for _ in range(reps):
        acc = base.clone()
        sync = torch.cuda.synchronize if acc.is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        fn(acc)
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.dry_run:
        args.numel, args.rounds, args.reps = 20_000, 2, 2
    torch.set_num_threads(args.threads)
    device = "cuda" if args.backend == "triton" and torch.cuda.is_available() else "cpu"
    n = args.numel
    k = max(1, math.ceil(args.density * n))
    cap = min(n, math.ceil(args.headroom * k))
    g = torch.Generator().manual_seed(0)
    base = torch.randn(n, generator=g).to(device)
    thr = dispatch.segment_thresholds(base, [0], [n], [k], backend=args.backend)
    # the next step's accumulator: the same distribution, a little larger (a drifting gradient)
    step = (base * 1.02 + 0.1 * torch.randn(n, generator=g).to(device)).contiguous()
    sent = int(dispatch.threshold_select_segments(step.clone(), [0], [n], thr, [cap], backend=args.backend)[2])
    paths = {
        "exact": lambda a: dispatch.topk_select_segments(a, [0], [n], [k], [cap], backend=args.backend),
        "reuse": lambda a: dispatch.threshold_select_segments(a, [0], [n], thr, [cap], backend=args.backend),
        "estimate": lambda a: dispatch.segment_thresholds(a, [0], [n], [k], backend=args.backend),
    }
    rounds: dict[str, list[float]] = {name: [] for name in (*paths, "amortized")}
    for _ in range(args.rounds):  # alternate: exact, then the threshold paths, every round
        for name, fn in paths.items():
            rounds[name].append(_time(fn, step, args.reps))
        rounds["amortized"].append(rounds["reuse"][-1] + rounds["estimate"][-1] / args.every)
    summary = {name: {"median_ms": 1e3 * statistics.median(v), "min_ms": 1e3 * min(v), "max_ms": 1e3 * max(v)}
               for name, v in rounds.items()}
    result = {
        "numel": n, "k": k, "capacity": cap, "every": args.every, "backend": args.backend, "device": device,
        "threads": args.threads, "rounds": args.rounds, "reps": args.reps,
        "reused_threshold_sent": sent, "paths": summary,
        "speedup_reuse": summary["exact"]["median_ms"] / summary["reuse"]["median_ms"],
        "speedup_amortized": summary["exact"]["median_ms"] / summary["amortized"]["median_ms"],
        "rounds_ms": {name: [1e3 * x for x in v] for name, v in rounds.items()},
    }
    for name, s in summary.items():
        print(f"{name:>9}: {s['median_ms']:8.3f} ms  (min {s['min_ms']:.3f}, max {s['max_ms']:.3f})")
    print(f"k={k}, cap={cap}, a reused threshold sent {sent} on the drifted step; "
          f"exact/reuse {result['speedup_reuse']:.2f}x, exact/amortized {result['speedup_amortized']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
