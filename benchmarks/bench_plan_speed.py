"""How long ``hetero-strategy plan ... --scale --chart`` takes from the shell, this checkout against a baseline.

Each round runs the command once per checkout, alternating (baseline first on even rounds, second
on odd ones), and times the whole process from the outside (start-up, imports, the model on the
meta device, the 1024-rank sweep, the chart, exit). A checkout is a ``src`` folder put first on
``PYTHONPATH`` (ahead of the editable install), e.g. a ``git worktree`` of the baseline commit.
One untimed warm-up run of each fills the bytecode and file caches. Issue 30's goal: under 5 s.

CPU::

    git worktree add /tmp/plan_base <commit>
    flock /tmp/hetero_cpu.lock python benchmarks/bench_plan_speed.py --base /tmp/plan_base/src \\
        --json benchmarks/results/plan_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _once(src: Path, out: Path) -> float:
    # the checkout's own console entry (cli.console where it has one, else cli.main), as its script would call it
    entry = ("import sys; from hetero_strategy import cli; "
             "sys.exit(cli.console() if hasattr(cli, 'console') else cli.main())")
    cmd = [sys.executable, "-c", entry, "plan", str(ROOT / "docs" / "clusters" / "rack64.yaml"),
           "--model", "resnet50", "--scale", "--chart", str(out / "scale.png"), "--json", str(out / "plan.json")]
    env = dict(os.environ, PYTHONPATH=str(src))
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the baseline checkout's src folder")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    runs = {"baseline": args.base.resolve(), "candidate": ROOT / "src"}
    times: dict[str, list[float]] = {k: [] for k in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in runs.items():
            _once(src, Path(tmp))  # warm-up
        for i in range(args.rounds):
            for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
                times[name].append(_once(runs[name], Path(tmp)))
    med = {k: statistics.median(v) for k, v in times.items()}
    def commit(where: Path) -> str:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              check=False).stdout.strip()

    result = {"benchmark": "plan_speed", "command": " ".join(sys.argv), "commit": commit(ROOT),
              "baseline_commit": commit(args.base), "rounds": args.rounds, "seconds": times,
              "median_s": med, "spread_s": {k: [min(v), max(v)] for k, v in times.items()},
              "candidate_over_baseline": med["candidate"] / med["baseline"], "goal_s": 5.0,
              "met": med["candidate"] < 5.0}
    print(json.dumps({k: result[k] for k in ("median_s", "spread_s", "candidate_over_baseline", "met")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
