#!/usr/bin/env bash
# Model zoo end to end, no downloads: generate a small TrojAI-style round on digits (12 models, half
# trojaned), split it into train/test/holdout with sequestered views, and run the baseline detectors (with
# the parameters they learned on the reference round's train split) on the sequestered test models.
# Usage: bash examples/zoo-demo.sh [OUT_DIR]   (make demo runs it with OUT_DIR=demo-out)
set -euo pipefail
OUT=${1:-demo-out}
Z=$OUT/zoo
rm -rf "$Z"
mkdir -p "$Z/scratch"
export OMP_NUM_THREADS=1

echo "== 1. generate a 12-model round (examples/zoo-round.yaml) with 2 workers"
assay zoo generate --config examples/zoo-round.yaml --out "$Z/round" --workers 2

echo "== 2. split it: train 6 / test 3 / holdout 3, stratified; test and holdout get a sequestered view"
assay zoo split "$Z/round" --train 0.5 --test 0.25 --holdout 0.25 --seed 1

echo "== 3. run the baseline detectors on each sequestered test model (TrojAI detector command line)"
for model in "$Z"/round/splits/test-sequestered/models/*/; do
  name=$(basename "$model")
  truth=$(cat "$Z/round/splits/test/models/$name/ground_truth.csv")
  line="$name trojaned=$truth"
  for detector in constant meta_classifier neural_cleanse; do
    python "detectors/$detector/entrypoint.py" infer --model_filepath "$model/model.pt" \
      --result_filepath "$Z/result.txt" --scratch_dirpath "$Z/scratch" --examples_dirpath "$model/clean-example-data" \
      --metaparameters_filepath "detectors/$detector/metaparameters.json" \
      --schema_filepath "detectors/$detector/metaparameters_schema.json" --learned_parameters_dirpath "detectors/$detector/learned_parameters"
    line="$line  $detector=$(printf '%.3f' "$(cat "$Z/result.txt")")"
  done
  echo "$line" | tee -a "$Z/detections.txt"
done
