"""Summarise benchmarks/demo_before_after.sh's runs: per commit, medians and spreads of the demo's
figures (from each run's demo.json, keys of ``hetero-strategy demo``), and head/base ratios.

usage: python benchmarks/demo_summary.py WORK BASE HEAD ROUNDS OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

FIGURES = {  # output key -> (mode in demo.json, field)
    "ddp_samples_per_s": ("ddp", "samples_per_s"), "hetero_samples_per_s": ("hetero_auto", "samples_per_s"),
    "ddp_fast_rank_idle_fraction": ("ddp", "fast_rank_idle_fraction"),
    "hetero_fast_rank_idle_fraction": ("hetero_auto", "fast_rank_idle_fraction"),
    "ddp_balance": ("ddp", "balance"), "hetero_balance": ("hetero_auto", "balance"),
    "ddp_accuracy": ("ddp", "accuracy"), "hetero_accuracy": ("hetero_auto", "accuracy"),
}


def main(argv: list[str]) -> int:
    work, base, head, rounds, out = Path(argv[0]), argv[1], argv[2], int(argv[3]), Path(argv[4])
    runs = []
    for r in range(1, rounds + 1):
        for side, commit in (("base", base), ("head", head)):
            modes = json.loads((work / f"r{r}_{side}" / "demo.json").read_text())["modes"]
            row = {"round": r, "commit": commit, **{k: modes[m][f] for k, (m, f) in FIGURES.items()}}
            row["speedup_vs_ddp"] = row["hetero_samples_per_s"] / row["ddp_samples_per_s"]
            row["hetero_batch_sizes"] = modes["hetero_auto"]["batch_sizes"]
            runs.append(row)

    def stat(commit: str, key: str) -> dict:
        vals = [x[key] for x in runs if x["commit"] == commit]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

    keys = [*FIGURES, "speedup_vs_ddp"]
    summary = {c: {k: stat(c, k) for k in keys} for c in (base, head)}
    ratio = summary[head]["speedup_vs_ddp"]["median"] / summary[base]["speedup_vs_ddp"]["median"]
    out.write_text(json.dumps({
        "what": f"make demo before ({base}) and after ({head}), alternating base/head in each round, "
                "under flock /tmp/hetero_cpu.lock",
        "command": f"benchmarks/demo_before_after.sh {base} {rounds}", "rounds": rounds,
        "runs": runs, "summary": summary, "head_over_base_speedup_ratio": ratio}, indent=2))
    for c in (base, head):
        s = summary[c]
        print(f"{c}: speedup {s['speedup_vs_ddp']['median']:.3f} ({s['speedup_vs_ddp']['min']:.3f}-"
              f"{s['speedup_vs_ddp']['max']:.3f}), hetero idle {s['hetero_fast_rank_idle_fraction']['median']:.1%}")
    print(f"head/base speedup ratio {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
