#!/usr/bin/env bash
# `make demo`: the three parts (zoo + leaderboard, DyePack, STAR), one progress line per step with the time
# it started, each part's whole output in OUT/logs/PART.log, and a summary with the total time at the end.
# A part that fails stops the demo with its step named (examples/check_demo.py) and its log's last lines.
# Usage: bash examples/demo.sh [OUT_DIR]   (make demo runs it with OUT_DIR=demo-out)
set -euo pipefail
OUT=${1:-demo-out}
mkdir -p "$OUT/logs"
START=$SECONDS
declare -A TOOK

clock() { printf '%2d:%02d' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)); }

run_part() {  # run_part NAME SCRIPT: its "== N. step" lines as progress, the rest to its log
  local name=$1 script=$2 began=$SECONDS log="$OUT/logs/$1.log"
  echo "[$(clock)] $name: starting (log: $log)"
  : >"$log"
  if ! bash "$script" "$OUT" > >(tee -a "$log" | while IFS= read -r line; do
    [[ $line == "== "* ]] && echo "[$(clock)] $name ${line#== }"
  done) 2>>"$log"; then
    sleep 0.2  # let the progress reader finish its last line
    echo "[$(clock)] $name FAILED; the last lines of $log:"
    tail -n 15 "$log" | sed 's/^/    /'
    exit 2
  fi
  sleep 0.2
  TOOK[$name]=$((SECONDS - began))
}

run_part zoo examples/zoo-demo.sh
run_part dyepack examples/dyepack-demo.sh
run_part star examples/star-demo.sh

echo
echo "== summary"
python examples/check_demo.py "$OUT"  # each part checked itself; all of it once more, in one place
for name in zoo dyepack star; do
  printf '  %-8s %3d s\n' "$name" "${TOOK[$name]}"
done
total=$((SECONDS - START))
printf '  %-8s %3d s (%d min %02d s); outputs in %s/, logs in %s/logs/\n' total $total $((total / 60)) $((total % 60)) "$OUT" "$OUT"
