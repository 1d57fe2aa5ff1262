"""DGC's fixes for sparse SGD with momentum, measured: steps to a target accuracy per variant.

Lin et al. (ICLR 2018) propose momentum correction, momentum-factor masking and an exponential
density warm-up. Each variant here trains the convergence bench's CNN (:mod:`.compression_e2e`:
283k parameters on sklearn digits, 2 ranks, batch 32 per rank, SGD lr 0.05) with ``topk`` and
``topk_allreduce`` at density 0.01 (constant schedule, no dense fallback, dense sync every 100):

* ``baseline`` — plain error feedback, the optimizer's momentum 0.9, dense warm-up;
* ``exp_warmup`` — baseline with the exponential warm-up (step 0 dense, then geometric to 0.01);
* ``mc`` — momentum correction 0.9 in the hook (optimizer momentum 0), no masking;
* ``mc_mask`` — mc with momentum-factor masking;
* ``mc_mask_exp`` — mc_mask with the exponential warm-up;

plus ``dense`` (the weighted all-reduce, momentum 0.9) for reference. Every variant x seed runs
on the same two ranks, seeds outermost. Steps to target do not depend on link speed, so the ranks
run on loopback.

Example (what produced benchmarks/results/dgc.json)::

    flock /tmp/hetero_cpu.lock env PYTHONPATH=src:benchmarks python -m hetero_bench.dgc --seeds 5
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

from hetero_bench import RESULTS
from hetero_bench._ranks import gloo_job, worker
from hetero_bench.compression_e2e import converge
from hetero_strategy.commands.flags import output_file

__all__ = ["VARIANTS", "main", "variant_hook"]

# variant -> (CompressionConfig fields beside the method's, optimizer momentum)
VARIANTS: dict[str, tuple[dict, float]] = {
    "baseline": ({}, 0.9),
    "exp_warmup": ({"density_warmup": "exponential"}, 0.9),
    "mc": ({"momentum_correction": 0.9, "momentum_masking": False}, 0.0),
    "mc_mask": ({"momentum_correction": 0.9, "momentum_masking": True}, 0.0),
    "mc_mask_exp": ({"momentum_correction": 0.9, "momentum_masking": True, "density_warmup": "exponential"}, 0.0),
}
METHODS = ("topk", "topk_allreduce")


def variant_hook(name: str, steps: int, tiers=None, warmup: int = 10, density: float = 0.01, model=None):
    """(state, hook, bucket_cap_mb) of ``<method>/<variant>`` or ``dense``."""
    from hetero_strategy.config import CompressionConfig
    from hetero_strategy.hooks import CompressedState, topk_hook
    from hetero_strategy.hooks.weighted import WeightedReduceState, weighted_allreduce_hook

    if name == "dense":
        return WeightedReduceState(None), weighted_allreduce_hook, 25
    method, variant = name.split("/")
    fields = VARIANTS[variant][0]
    cfg = CompressionConfig(method=method, base_density=density, density_schedule="constant", dense_fallback=False,
                            dense_warmup_steps=warmup, **fields)
    return CompressedState(cfg, max_steps=steps), topk_hook, 25


def _momentum(name: str) -> float:
    return 0.9 if name == "dense" else VARIANTS[name.split("/")[1]][1]


def _median_steps(per_seed: list[int | None]) -> float | None:
    """Median over seeds; a seed that never reached the target counts as beyond the budget."""
    m = statistics.median(math.inf if s is None else s for s in per_seed)
    return None if math.isinf(m) else m


def _summarise(raw: dict, args: argparse.Namespace) -> dict:
    variants = {}
    for name, runs in raw.items():
        per_seed = [r["steps_to_target"] for r in runs]
        variants[name] = {"steps_to_target_per_seed": per_seed, "steps_to_target_median": _median_steps(per_seed),
                          "accuracy": statistics.median(r["accuracy"] for r in runs),
                          "accuracy_per_seed": [r["accuracy"] for r in runs],
                          "optimizer_momentum": _momentum(name), "dense_steps_per_seed": [r["dense_steps"] for r in runs]}
    return {"variants": variants, "setup": {
        "model": "CNN 283k parameters on sklearn digits (hetero_bench.compression_e2e), 2 gloo ranks on loopback, "
                 "batch 32/rank, 1 CPU thread each",
        "optimizer": f"SGD lr {args.lr}; momentum 0.9 in the optimizer (baseline, exp_warmup, dense) or in the "
                     "hook (mc*: momentum_correction 0.9, optimizer momentum 0)",
        "compression": f"density {args.density} constant, dense_fallback off, dense_sync_every 100, "
                       f"{args.warmup} warm-up steps (dense, or the exponential ramp)",
        "target": args.target, "budget_steps": args.steps, "eval_every": args.eval_every, "seeds": args.seeds,
        "statistics": "medians over seeds; a seed that misses the target counts as beyond the budget "
                      "(median null when most seeds miss)"}}


def _worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="dgc worker")
    p.add_argument("--out", required=True)
    p.add_argument("--methods", nargs="+", required=True)
    for flag, kind in (("--steps", int), ("--seeds", int), ("--eval-every", int), ("--target", float), ("--lr", float),
                       ("--warmup", int), ("--density", float)):
        p.add_argument(flag, type=kind, required=True)
    args = p.parse_args(argv)
    args.momentum, args.charge_link = 0.9, None  # converge's fields: momentum per variant below
    hook = functools.partial(variant_hook, warmup=args.warmup, density=args.density)
    return gloo_job(args.out, lambda: converge(args, hook, momentum_of=_momentum), timeout_s=1800)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetero_bench.dgc", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=output_file, default=str(RESULTS / "dgc.json"))
    p.add_argument("--steps", type=int, default=300, help="budget per run")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps (dense_warmup_steps)")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:  # one rank, started below
        return _worker(argv[1:])
    args = p.parse_args(argv)
    from hetero_bench.compression import _local  # two ranks on loopback, as bench compression runs them

    names = ["dense", *(f"{m}/{v}" for m in METHODS for v in args.variants)]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "dgc.json"))
        flags = ["--out", out, "--methods", *names, "--steps", str(args.steps), "--seeds", str(args.seeds),
                 "--eval-every", str(args.eval_every), "--target", str(args.target), "--lr", str(args.lr),
                 "--warmup", str(args.warmup), "--density", str(args.density)]
        _local(flags, timeout=3600, argv=[*worker("dgc"), "worker"])
        raw = json.loads(Path(out).read_text())
    result = _summarise(raw, args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    for name, v in result["variants"].items():
        print(f"{name:28s} steps to {args.target}: median {v['steps_to_target_median']}, per seed "
              f"{v['steps_to_target_per_seed']}, accuracy {v['accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
