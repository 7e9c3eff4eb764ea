#!/usr/bin/env bash
# Write every dry-run plan the restructuring must keep byte-identical into one folder:
#   bash dev/dry_run_plans.sh OUT_DIR   then   diff -r BEFORE_DIR AFTER_DIR
set -euo pipefail
out=${1:?usage: dev/dry_run_plans.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export COLUMNS=160
run() {  # name, then run_all arguments
  local name=$1; shift
  python reproduce/run_all.py "$@" --dry-run results_dir=/tmp/prism-plans/results >"$out/$name.txt" 2>&1 || echo "exit $?" >>"$out/$name.txt"
}
for scale in 124m 354m 757m; do
  run "$scale-1node" --scale "$scale" --nodes 1
  run "$scale-4nodes" --scale "$scale" --nodes 4
done
run table5 --scale 124m --schedules table5
run tiny --scale tiny
