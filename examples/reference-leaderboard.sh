#!/usr/bin/env bash
# The three baseline detectors on the reference round (docs/zoo.md), through the leaderboard: a round over
# build/reference-round/splits, one team per detector, test split, close, holdout, static site.
# Needs `make reference-round` first. About 17 minutes on 2 cores. Usage: bash examples/reference-leaderboard.sh [OUT]
set -euo pipefail
OUT=${1:-build/ref-lb}
mkdir -p "$OUT"
export ASSAY_DB_URL="sqlite:///$(realpath "$OUT")/lb.db" ASSAY_HOME="$(realpath "$OUT")/home" OMP_NUM_THREADS=1
rm -rf "$OUT/lb.db" "$OUT/home" "$OUT/site"
assay leaderboard init
assay leaderboard round create reference --dataset build/reference-round/splits --per-model-timeout 300
assay leaderboard round open reference
for d in constant meta_classifier neural_cleanse; do
  assay leaderboard team add "$d" --kind baseline
  assay leaderboard submit "detectors/$d" --team "$d" --round reference --split test
done
start=$(date +%s)
assay leaderboard worker --once --workers 2
echo "test jobs: $(( $(date +%s) - start )) s"
assay leaderboard show reference --split test --json > "$OUT/test.json"
assay leaderboard show reference --split test
assay leaderboard round close reference
start=$(date +%s)
assay leaderboard worker --once --workers 2
echo "holdout jobs: $(( $(date +%s) - start )) s"
assay leaderboard show reference --split holdout --json > "$OUT/holdout.json"
assay leaderboard show reference --split holdout
assay leaderboard export reference --out "$OUT/site"
