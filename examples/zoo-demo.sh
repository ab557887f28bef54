#!/usr/bin/env bash
# Model zoo and leaderboard end to end, no downloads: generate a small TrojAI-style round on digits
# (16 models, half trojaned), split it into train/test/holdout with sequestered views, run the three
# baseline detectors (with the parameters they learned on the reference round's train split) as three teams
# through the sandboxed leaderboard harness, close the round on holdout, and publish a static page.
# Fails (examples/check_demo.py) when a baseline job is not done or the standings are empty.
# Usage: bash examples/zoo-demo.sh [OUT_DIR]   (make demo runs it with OUT_DIR=demo-out)
set -euo pipefail
OUT=${1:-demo-out}
Z=$OUT/zoo
rm -rf "$Z"
mkdir -p "$Z/scratch"
export OMP_NUM_THREADS=1

echo "== 1. generate a 16-model round (examples/zoo-round.yaml) with 2 workers"
assay zoo generate --config examples/zoo-round.yaml --out "$Z/round" --workers 2

echo "== 2. split it: train 8 / test 4 / holdout 4, stratified; test and holdout get a sequestered view"
assay zoo split "$Z/round" --train 0.5 --test 0.25 --holdout 0.25 --seed 1

echo "== 3. leaderboard: a round over the split, the three baselines as three teams, one worker (sandboxed runs)"
export ASSAY_DB_URL="sqlite:///$Z/leaderboard.db" ASSAY_HOME="$Z/assay-home"
assay leaderboard init
assay leaderboard round create demo --dataset "$Z/round/splits" --per-model-timeout 120
assay leaderboard round open demo
C=$Z/check  # the CLI's --json answers, which examples/check_demo.py judges
mkdir -p "$C"
BASELINES="constant meta_classifier neural_cleanse"
for detector in $BASELINES; do
  assay leaderboard team add "team-$detector" --kind baseline
  assay leaderboard submit "detectors/$detector" --team "team-$detector" --round demo --split test --json \
    | tee "$C/submit-$detector.json"
done
assay leaderboard worker --once --workers 2
assay leaderboard show demo --split test
assay leaderboard show demo --split test --json > "$C/standings-test.json"
for detector in $BASELINES; do
  id=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["submission"])' "$C/submit-$detector.json")
  assay leaderboard results "$id" --json > "$C/results-$detector.json"
done
python examples/check_demo.py "$OUT" zoo-test  # every baseline job done, all three ranked

echo "== 4. close the round: each team's best test submission runs on holdout; publish the static site"
assay leaderboard round close demo
assay leaderboard worker --once --workers 2
assay leaderboard show demo --split holdout
assay leaderboard show demo --split holdout --json > "$C/standings-holdout.json"
assay leaderboard status --json > "$C/status.json"
python examples/check_demo.py "$OUT" zoo-holdout  # every job done, all three ranked on holdout
assay leaderboard export demo --out "$Z/site"
echo "static leaderboard: $Z/site/index.html"
