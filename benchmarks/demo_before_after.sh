#!/usr/bin/env bash
# `make demo` before and after a change, alternating, one run at a time under the shared lock.
# usage: benchmarks/demo_before_after.sh BASE_COMMIT ROUNDS OUT.json   (from the checkout's root,
# after `make install`). The base is an extracted copy of BASE_COMMIT run with its own src/ first
# on PYTHONPATH; the head is this working tree's editable install. Each run's demo.json stays
# under $WORK; benchmarks/demo_summary.py writes the medians and the head/base ratio.
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
    if [ "$side" = base ]; then pp="$WORK/base/src"; else pp=""; fi
    PYTHONPATH="$pp" timeout 900 flock /tmp/hetero_cpu.lock \
      "$py" -c "import sys; from hetero_strategy.cli import main; sys.exit(main(['demo', '--out', '$dir']))" \
      > "$dir/log.txt" 2>&1 || { echo "run $r $side failed: see $dir/log.txt"; exit 1; }
    echo "round $r $side done"
  done
done
"$py" benchmarks/demo_summary.py "$WORK" "$base" "$head" "$rounds" "$out"
