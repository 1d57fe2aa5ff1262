"""What ``import hetero_strategy`` costs a fresh interpreter, against ``import torch, lightning``.

Each round starts one fresh ``python -c`` per statement, in turn (the order rotates every round,
so drift on a shared machine falls on all of them alike), from an empty temporary folder, and
times it from the outside (wall clock of the whole interpreter: start-up, import, exit). One
untimed warm-up round fills the bytecode and file caches first.

* ``baseline``: ``import torch, lightning``, what a Lightning job pays anyway;
* ``hetero``: ``import hetero_strategy`` (the issue's figure; it imports no torch: the
  registration with Lightning waits for Lightning);
* ``hetero_with_lightning``: ``import torch, lightning, hetero_strategy``, the registration
  included (the Lightning and Fabric adapters load): what a Lightning user really adds;
* ``torch``: ``import torch`` alone, for context;
* ``registration_in_process``: ``import hetero_strategy`` after ``import torch, lightning``,
  timed inside the interpreter (``perf_counter`` around that one statement): the same added cost as
  ``hetero_with_lightning - baseline`` without the noise of two whole interpreters on a shared machine.

``extra_s`` is ``median(hetero) - median(baseline)``, ``extra_with_lightning_s`` is
``median(hetero_with_lightning) - median(baseline)``; the target is ``extra_s <= 0.3``.

CPU:  ``flock /tmp/hetero_cpu.lock python benchmarks/bench_import.py --json benchmarks/results/import_cost.json``
Where the time goes: ``python -X importtime -c "import hetero_strategy"``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STATEMENTS = {
    "baseline": "import torch, lightning",
    "hetero": "import hetero_strategy",
    "hetero_with_lightning": "import torch, lightning, hetero_strategy",
    "torch": "import torch",
    "registration_in_process": "import time, torch, lightning; t0 = time.perf_counter(); import hetero_strategy; "
                               "print(time.perf_counter() - t0)",
}
TARGET_EXTRA_S = 0.3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (at least 5)")
    p.add_argument("--python", default=sys.executable, help="the interpreter to time (default: this one)")
    p.add_argument("--json", metavar="PATH", default=None)
    return p


def _time_once(python: str, name: str, cwd: str) -> float:
    """Wall seconds of one fresh interpreter running the statement (or the time it prints itself)."""
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-c", STATEMENTS[name]], cwd=cwd, check=True, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return float(proc.stdout.split()[-1]) if name == "registration_in_process" else wall


def _summary(times: list[float]) -> dict:
    return {"median": round(statistics.median(times), 3), "spread": [round(min(times), 3), round(max(times), 3)],
            "runs": [round(t, 3) for t in times]}


def measure(python: str, rounds: int) -> dict:
    names = list(STATEMENTS)
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as cwd:  # not the checkout: '' on sys.path must find nothing
        for name in names:  # warm-up, untimed
            _time_once(python, name, cwd)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                times[name].append(_time_once(python, name, cwd))
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        "rounds": rounds,
        "statements": STATEMENTS,
        "baseline_s": _summary(times["baseline"]),
        "hetero_s": _summary(times["hetero"]),
        "hetero_with_lightning_s": _summary(times["hetero_with_lightning"]),
        "torch_s": _summary(times["torch"]),
        "registration_in_process_s": _summary(times["registration_in_process"]),
        "extra_s": round(med["hetero"] - med["baseline"], 3),
        "extra_with_lightning_s": round(med["hetero_with_lightning"] - med["baseline"], 3),
        "target_extra_s": TARGET_EXTRA_S,
        "python": python,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rounds < 5:
        raise SystemExit("--rounds: at least 5 (the figure is a median of 5 or more)")
    result = measure(args.python, args.rounds)
    for key in ("torch_s", "baseline_s", "hetero_s", "hetero_with_lightning_s", "registration_in_process_s"):
        s = result[key]
        print(f"{key[:-2]:>23}: median {s['median']:.3f} s  [{s['spread'][0]:.3f}, {s['spread'][1]:.3f}]")
    print(f"{'extra':>23}: {result['extra_s']:+.3f} s (target <= {TARGET_EXTRA_S} s); "
          f"with Lightning loaded: {result['extra_with_lightning_s']:+.3f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["extra_s"] <= TARGET_EXTRA_S else 1


if __name__ == "__main__":
    sys.exit(main())
