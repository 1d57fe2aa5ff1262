"""How steady is this machine's CPU? One process per core, pinned, each timing the same matmul loop
in back-to-back windows over the same wall-clock span; per core the windows' spread about their
median, and between cores the correlation and the spread of their ratio. Phases of both cores
busy take turns with phases of each core alone (the other idle): ``alone_over_both``, how much
faster a core runs while the other does not compute (1.0 for independent cores).

Why: every emulated-cluster benchmark gives ranks whole or partial cores, and a split or a
prediction is only as good as two cores' speeds keep their ratio. Run alone, under the lock.

Example::

    flock /tmp/hetero_cpu.lock .venv/bin/python benchmarks/bench_host_noise.py \\
        --json benchmarks/results/host_noise.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

_PHASE = 4
"""Windows per phase: the span runs phases in turn, both cores busy, core 0 alone, core 1 alone, so
a drift of the host over seconds weighs on all three alike."""


def _active(core: int, k: int) -> bool | None:
    """Window k for ``core``: True (timed with both busy), False (timed alone), None (idle)."""
    phase = (k // _PHASE) % 3
    return True if phase == 0 else (False if phase == core + 1 else None)


def _rates(core: int, start: float, windows: int, window_s: float, out: mp.Queue) -> None:
    import torch

    torch.set_num_threads(1)
    os.sched_setaffinity(0, {core})
    a = torch.randn(256, 256)
    rates, alone = [], []
    for k in range(windows):
        begin, end, mode = start + window_s * k, start + window_s * (k + 1), _active(core, k)
        while time.time() < (end if mode is None else begin):  # idle: the other core's turn alone
            time.sleep(0.001)
        if mode is None:
            continue
        n, t0 = 0, time.perf_counter()
        while time.time() < end:  # windows end on the shared clock, so the cores' windows line up
            for _ in range(10):
                a @ a
            n += 10
        (rates if mode else alone).append(n / (time.perf_counter() - t0))
    out.put((core, rates, alone))


def _spread(values: list[float]) -> dict[str, float]:
    mid = statistics.median(values)
    return {"sd_over_median": statistics.pstdev(values) / mid, "min_over_median": min(values) / mid,
            "max_over_median": max(values) / mid}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="span timed, all phases (default 60)")
    p.add_argument("--window", type=float, default=0.5, help="seconds per window (default 0.5)")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        print("bench_host_noise: needs two cores", file=sys.stderr)
        return 2
    windows = max(2, round(args.seconds / args.window))
    ctx, start = mp.get_context("spawn"), time.time() + 3.0  # after both have imported torch
    out = ctx.Queue()
    procs = [ctx.Process(target=_rates, args=(c, start, windows, args.window, out)) for c in cores]
    for proc in procs:
        proc.start()
    got, alone = {}, {}
    for _ in procs:
        core, rates, solo = out.get(timeout=args.seconds + 120)
        got[core], alone[core] = rates, solo
    for proc in procs:
        proc.join(timeout=10)
    a, b = got[cores[0]], got[cores[1]]
    ratio = [x / y for x, y in zip(a, b)]
    result = {"benchmark": "host_noise", "window_s": args.window, "windows": windows,
              "cores": {str(c): _spread(got[c]) for c in cores}, "correlation": statistics.correlation(a, b),
              "ratio": _spread(ratio),
              "alone_over_both": {str(c): statistics.median(alone[c]) / statistics.median(got[c]) for c in cores},
              "rates": {str(c): got[c] for c in cores}, "rates_alone": {str(c): alone[c] for c in cores}}
    from hetero_strategy.commands.provenance import source_commit

    result["commit"] = source_commit()
    for c in cores:
        s = result["cores"][str(c)]
        print(f"core {c}: sd {s['sd_over_median']:.1%} of the median, [{s['min_over_median']:.2f}, "
              f"{s['max_over_median']:.2f}] in {args.window} s windows")
    print(f"correlation {result['correlation']:.2f}; ratio of the cores: sd {result['ratio']['sd_over_median']:.1%}, "
          f"[{result['ratio']['min_over_median']:.2f}, {result['ratio']['max_over_median']:.2f}]")
    print("alone (the other core idle) over both busy: " + ", ".join(
        f"core {c} {result['alone_over_both'][str(c)]:.2f}" for c in cores))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
