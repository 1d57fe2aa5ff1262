"""Benchmark top-k selection with error feedback: Triton kernels vs torch.topk vs threshold+nonzero.

For each bucket size n and density d (k = ceil(d*n)) it times, with CUDA events after a warm-up
(median of ``--iters``), three ways to produce the payload (values, indices) and the residual:

* ``triton``: :func:`hetero_strategy.triton_kernels.dispatch.topk_select` (radix threshold +
  ordered compaction; no host sync, exactly k selected);
* ``torch.topk``: ``torch.topk(|acc|, k)``, gather, residual with the sent entries zeroed;
* ``thresh+nonzero``: threshold from ``torch.topk`` on a 1% strided sample, then
  ``nonzero()`` (a host sync; selects only approximately k);

and reports effective GB/s and the distance to the memory-bandwidth floor. The floor is the
traffic any implementation must do, ``4n`` (read acc) + ``4n`` (write residual) + ``8k``
(values + int32 indices), divided by the device's bandwidth measured by a large copy.
``x_floor`` = time / floor time (1.0 is perfect; the issue's goal is <= 3 at 25M / 1%).

GPU:  ``python benchmarks/bench_kernels.py --json benchmarks/results/kernels.json``
CPU:  ``python benchmarks/bench_kernels.py --dry-run`` (torch paths on tiny sizes: checks the setup only)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch

PATHS = ("triton", "torch.topk", "thresh+nonzero")


def _parse_floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=_parse_floats, default=None, help="comma list, default 1e6,1e7,2.5e7,1e8")
    p.add_argument("--densities", type=_parse_floats, default=None, help="comma list, default 0.001,0.01,0.1")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--passes", type=int, default=3, choices=(1, 2, 3), help="radix passes of the Triton path")
    p.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON")
    p.add_argument("--no-check", action="store_true", help="skip the Triton-vs-reference equality check")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, torch paths only (setup check)")
    return p


def _topk_path(acc: torch.Tensor, k: int):
    idx = torch.topk(acc.abs(), k, sorted=False).indices  # (k,) int64
    residual = acc.clone()
    residual[idx] = 0.0
    return acc[idx], idx.to(torch.int32), residual


def _threshold_nonzero_path(acc: torch.Tensor, k: int):
    stride = 100  # 1% sample, strided: no RNG cost, fine for gradients without periodic structure
    sample = acc[::stride].abs()
    ks = max(1, min(sample.numel(), math.ceil(k / stride)))
    thr = torch.topk(sample, ks, sorted=False).values.min()
    mask = acc.abs() >= thr
    idx = mask.nonzero().flatten()  # host sync: the output size is data-dependent
    return acc[idx], idx.to(torch.int32), acc.masked_fill(mask, 0.0)


def make_paths(passes: int, with_triton: bool) -> dict[str, Callable]:
    from hetero_strategy.triton_kernels import topk_select as ts

    paths: dict[str, Callable] = {}
    if with_triton:
        paths["triton"] = lambda acc, k: ts.topk_select(acc, k, k, passes=passes)
    else:  # dry run: the torch reference of the same op stands in, so the table has the same rows
        paths["torch-ref"] = lambda acc, k: ts.topk_select_torch(acc, k, k, passes=passes)
    paths["torch.topk"] = _topk_path
    paths["thresh+nonzero"] = _threshold_nonzero_path
    return paths


def _timer(cuda: bool) -> Callable[[Callable[[], object]], float]:
    def time_cuda(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def time_cpu(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return time_cuda if cuda else time_cpu


def measure(fn: Callable[[], object], timer, warmup: int, iters: int) -> float:
    """Median seconds of ``iters`` timed calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return statistics.median(timer(fn) for _ in range(iters))


def peak_bandwidth(device: torch.device, timer, nbytes: int) -> float:
    """Bytes/s of a large device copy (read + write), the practical bandwidth ceiling."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), timer, warmup=2, iters=5)
    return 2 * nbytes / t


def check_against_reference(acc: torch.Tensor, k: int, passes: int) -> None:
    """Triton path must equal the torch reference bitwise (counts, indices, values, residual)."""
    from hetero_strategy.triton_kernels import topk_select as ts

    got = ts.topk_select(acc, k, k, passes=passes)
    ref = ts.topk_select_torch(acc, k, k, passes=passes)
    for name, a, b in zip(("values", "indices", "count", "residual"), got, ref):
        if not torch.equal(a, b):
            raise SystemExit(f"bench_kernels: Triton path differs from the reference in {name} (n={acc.numel()}, k={k})")


def _bench_point(acc, k, density, paths, timer, peak, args) -> list[dict]:
    """Rows for one (n, k): every path timed on the same input, speedups against torch.topk."""
    n = acc.numel()
    floor_bytes = 8 * n + 8 * k  # read acc + write residual + write values and int32 indices
    rows = []
    for name, fn in paths.items():
        t = measure(lambda fn=fn: fn(acc, k), timer, args.warmup, args.iters)
        rows.append({"n": n, "density": density, "k": k, "path": name, "median_ms": t * 1e3,
                     "gbps": floor_bytes / t / 1e9, "x_floor": t / (floor_bytes / peak)})
    base = next(r["median_ms"] for r in rows if r["path"] == "torch.topk")
    for r in rows:
        r["speedup_vs_topk"] = base / r["median_ms"]
    return rows


def run(args) -> dict:
    cuda = not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    sizes = [int(s) for s in (args.sizes or ([1e3, 2e4] if args.dry_run else [1e6, 1e7, 2.5e7, 1e8]))]
    densities = args.densities or ([0.01, 0.1] if args.dry_run else [0.001, 0.01, 0.1])
    timer = _timer(cuda)
    peak = peak_bandwidth(device, timer, (1 << 30) if cuda else (64 << 20))
    paths = make_paths(args.passes, with_triton=cuda)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for n in sizes:
        acc = torch.randn(n, device=device, generator=gen)  # (n,) fp32, gradient-like
        for d in densities:
            k = max(1, math.ceil(d * n))
            if cuda and not args.no_check:
                check_against_reference(acc, k, args.passes)
            rows += _bench_point(acc, k, d, paths, timer, peak, args)
        del acc  # NOTE: free the 400 MB bucket before allocating the next size
    name = torch.cuda.get_device_name(device) if cuda else "cpu (dry run)"
    return {"device": name, "peak_gbps": peak / 1e9, "passes": args.passes, "warmup": args.warmup,
            "iters": args.iters, "torch": torch.__version__, "results": rows}


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"top-k select on {report['device']} (copy bandwidth {report['peak_gbps']:.0f} GB/s)")
    for col in ("n", "density", "k", "path", "median ms", "GB/s", "x floor", "vs topk"):
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=True)
    for r in report["results"]:
        table.add_row(f"{r['n']:,}", f"{r['density']:.1%}", f"{r['k']:,}", r["path"], f"{r['median_ms']:.3f}",
                      f"{r['gbps']:.1f}", f"{r['x_floor']:.2f}", f"{r['speedup_vs_topk']:.2f}x")
    Console(width=None if sys.stdout.isatty() else 132).print(table)  # NOTE: no 80-column cut in logs


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.dry_run:
        if not torch.cuda.is_available():
            print("bench_kernels: no CUDA device here; this benchmark times GPU kernels. "
                  "Run it on a GPU machine, or use --dry-run to check the setup on the CPU.", file=sys.stderr)
            return 2
        from hetero_strategy.triton_kernels._common import interpreter_on
        from hetero_strategy.triton_kernels.dispatch import triton_available

        if not triton_available():
            print("bench_kernels: Triton does not import; install triton to benchmark the kernels.", file=sys.stderr)
            return 2
        if interpreter_on():
            print("bench_kernels: TRITON_INTERPRET is set, which would time the CPU interpreter; unset it.",
                  file=sys.stderr)
            return 2
    report = run(args)
    print_table(report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
