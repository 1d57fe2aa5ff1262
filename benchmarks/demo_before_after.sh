#!/usr/bin/env bash
# `make demo` before and after a change, alternating, one run at a time under the shared lock.
# usage: benchmarks/demo_before_after.sh BASE_COMMIT ROUNDS OUT.json   (from the checkout's root,
# after `make install`). The base is an extracted copy of BASE_COMMIT run with its own src/ on
# PYTHONPATH; the head is this working tree. Each run's demo.json is kept under $WORK.
set -euo pipefail
base=${1:?base commit}; rounds=${2:-5}; out=${3:-benchmarks/results/demo_before_after.json}
head=$(git rev-parse --short HEAD)
WORK=$(mktemp -d /tmp/demo_ba.XXXX)
trap 'rm -rf "$WORK/base"' EXIT
mkdir -p "$WORK/base" && git archive "$base" | tar -x -C "$WORK/base"
ln -s ../../triton_kernels "$WORK/base/src/hetero_strategy/triton_kernels"  # setup.py's package_dir, by hand
py=.venv/bin/python
for r in $(seq 1 "$rounds"); do
  for side in base head; do
    dir="$WORK/r${r}_$side"; mkdir -p "$dir"
    # the head is the editable install of this tree; the base goes first on the path
    if [ "$side" = base ]; then pp="$WORK/base/src"; else pp=""; fi
    PYTHONPATH="$pp" timeout 900 flock /tmp/hetero_cpu.lock \
      "$py" -c "import sys; from hetero_strategy.cli import main; sys.exit(main(['demo', '--out', '$dir']))" \
      > "$dir/log.txt" 2>&1 || { echo "run $r $side failed: see $dir/log.txt"; exit 1; }
    echo "round $r $side done"
  done
done
"$py" - "$WORK" "$base" "$head" "$rounds" "$out" <<'PY'
import json, statistics, sys
work, base, head, rounds, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
keys = ("ddp_samples_per_s", "hetero_samples_per_s", "speedup_vs_ddp", "hetero_batch_sizes",
        "ddp_fast_rank_idle_fraction", "hetero_fast_rank_idle_fraction", "hetero_accuracy", "ddp_accuracy")
runs = []
for r in range(1, rounds + 1):
    for side, commit in (("base", base), ("head", head)):
        d = json.load(open(f"{work}/r{r}_{side}/demo.json"))
        runs.append({"round": r, "commit": commit, **{k: d.get(k) for k in keys}})
def med(commit, key):
    vals = [x[key] for x in runs if x["commit"] == commit and x[key] is not None]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None
summary = {c: {k: med(c, k) for k in keys if k != "hetero_batch_sizes"} for c in (base, head)}
ratio = summary[head]["speedup_vs_ddp"]["median"] / summary[base]["speedup_vs_ddp"]["median"]
json.dump({"what": f"make demo before ({base}) and after ({head}), alternating, flock /tmp/hetero_cpu.lock",
           "command": f"benchmarks/demo_before_after.sh {base} {rounds}",
           "runs": runs, "summary": summary, "head_over_base_speedup_ratio": ratio,
           "head_last_run_dir": f"{work}/r{rounds}_head"}, open(out, "w"), indent=2)
print(json.dumps(summary, indent=1)); print("head/base speedup ratio", round(ratio, 3))
PY
