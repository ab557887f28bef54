#!/usr/bin/env bash
# STAR end to end on bundled real models and data, no downloads:
#   1. rehearse the example campaign with SmolLM2-135M-Instruct as red teamer, target and annotators (seed
#      topics from Do-Not-Answer; every row is marked machine-made) through the real assignment engine,
#   2. export it (Parquet, with the spec), import HarmBench's behaviours as a comparison set,
#   3. `assay star report`: reliability, in-group vs out-group, group effects, coverage and a thematic map
#      (all-MiniLM-L6-v2 embeddings, UMAP, Ward) as one HTML page + CSV + JSON.
# Fails (examples/check_demo.py) when the report is missing or counts no dialogues.
# Usage: bash examples/star-demo.sh [OUT_DIR] [DIALOGUES]   (make demo runs it with OUT_DIR=demo-out)
set -euo pipefail
OUT=${1:-demo-out}
N=${2:-24}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ASSAY_HOME=${ASSAY_HOME:-$OUT/assay-home}
S=$OUT/star
rm -rf "$S"
mkdir -p "$S"
export ASSAY_DB_URL="sqlite:///$S/star.db"
SMOLLM=$(python -m assay.assets smollm2)
HARMBENCH=$(python -m assay.assets harmbench)

echo "== 1. rehearse $N dialogues with SmolLM2 playing every part (machine-made rows)"
assay star simulate examples/star-campaign.yaml --target "hf:$SMOLLM" -n "$N" --turns 1 \
  --max-new-tokens 48 --seed 7 --seed-topics donotanswer --campaign star-demo --ratings likelihood

echo "== 2. export, and import HarmBench behaviours for comparison"
assay star export star-demo --out "$S/export" --format parquet --machine include
assay star import "$HARMBENCH" --format lines --out "$S/harmbench.jsonl"

echo "== 3. report"
assay star report --export "$S/export" --compare "$S/harmbench.jsonl" --clusters 8 --out "$S/report" \
  --cache "$ASSAY_HOME/cache/embeddings.sqlite"
python examples/check_demo.py "$OUT" star  # report.html there, its summary counting the dialogues
