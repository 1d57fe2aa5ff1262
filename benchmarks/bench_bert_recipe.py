"""Benchmark: does the BERT recipe's offline default learn, under hetero and under plain DDP?

Runs ``recipes/bert_lightning.py`` (tiny BERT on the keyword reviews, 2 CPU ranks) for
``--steps`` optimizer steps, alternating ``strategy=hetero`` and ``strategy=ddp`` with the same
seed in each round (weights, data and shuffle follow the seed), and scores the whole held-out
set. Reports per-mode medians with min/max against chance (50%, the classes are balanced by
construction up to sampling noise).

    flock /tmp/hetero_cpu.lock .venv/bin/python benchmarks/bench_bert_recipe.py --json benchmarks/results/bert_recipe.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hetero_strategy.dist.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "bert_lightning.py"
MODES = {"hetero": "hetero", "ddp": "ddp"}


def run_once(mode: str, seed: int, steps: int, batch: int, timeout: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    env.pop("HETERO_STRATEGY_CONFIG", None)
    cmd = [sys.executable, str(RECIPE), "--trainer.accelerator=cpu", "--trainer.devices=2",
           f"--trainer.strategy={MODES[mode]}", f"--trainer.max_steps={steps}", "--trainer.logger=false",
           f"--seed_everything={seed}", f"--model.seed={seed}", f"--data.seed={seed}", f"--data.batch_size={batch}"]
    start = time.perf_counter()
    work = tempfile.mkdtemp(prefix="bert_recipe_")  # the CLI writes its config.yaml there
    proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # NOTE: on a timeout the ranks die with the launcher
    try:
        log, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.perf_counter() - start
    found = re.search(rf"^RESULT accuracy=([\d.]+) steps={steps}$", log, re.MULTILINE)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{mode} seed {seed} failed ({proc.returncode}):\n{log[-4000:]}")
    split = re.search(r"split as \[([\d, ]+)\]", log)
    return {"mode": mode, "seed": seed, "accuracy": float(found.group(1)), "wall_s": round(wall, 2),
            "batch_sizes": [int(b) for b in split.group(1).split(",")] if split else None}


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="mean per-rank batch (global 64)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    runs = []
    for seed in range(args.rounds):  # alternate, so drift on the machine hits both modes alike
        for mode in (("hetero", "ddp") if seed % 2 == 0 else ("ddp", "hetero")):
            runs.append(run_once(mode, seed, args.steps, args.batch_size, args.timeout))
            print(json.dumps(runs[-1]), flush=True)
    by_mode = {m: _stats([r["accuracy"] for r in runs if r["mode"] == m]) for m in MODES}
    diffs = [next(r["accuracy"] for r in runs if r["mode"] == "hetero" and r["seed"] == s)
             - next(r["accuracy"] for r in runs if r["mode"] == "ddp" and r["seed"] == s) for s in range(args.rounds)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout
    out = {"benchmark": "bert_recipe", "steps": args.steps, "rounds": args.rounds, "global_batch": 2 * args.batch_size,
           "chance": 0.5, "accuracy": by_mode, "hetero_minus_ddp": _stats(diffs), "runs": runs,
           "commit": commit.strip(), "command": " ".join(["python", "benchmarks/bench_bert_recipe.py", *sys.argv[1:]])}
    print(json.dumps({k: out[k] for k in ("steps", "accuracy", "hetero_minus_ddp")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
