#!/usr/bin/env bash
# The difficulty ladder of docs/zoo.md: three reference rounds (images easy, images hard, text), each
# generated, split and measured by `assay zoo difficulty` (the baselines cross-validated on its training
# split). Reference rounds live here, never in tests: 4 minutes on 2 quiet cores (15 on busy ones).
#   bash examples/difficulty-ladder.sh [OUT]      (default build/difficulty-ladder)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/difficulty-ladder}"
assay="${ASSAY:-.venv/bin/assay}"
export OMP_NUM_THREADS=1
mkdir -p "$out"
for config in examples/difficulty-ladder/*.yaml; do
    name="$(basename "$config" .yaml)"
    start=$SECONDS
    "$assay" zoo generate --config "$config" --out "$out/$name" --workers "${WORKERS:-1}" >/dev/null
    "$assay" zoo split "$out/$name" --train 0.5 --test 0.3 --holdout 0.2 --seed 1 >/dev/null
    "$assay" zoo difficulty "$out/$name" --json > "$out/$name.difficulty.json"
    echo "$name: built, split and measured in $((SECONDS - start)) s"
done
.venv/bin/python - "$out" <<'PY'
import json, pathlib, sys
rows = []
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.difficulty.json")):
    report = json.loads(path.read_text())
    for cell in report["cells"]:
        if cell["factor"] == "all" and cell["detector"] != "constant":
            rows.append((path.name.split(".")[0], cell))
print(f"{'round':<16} {'baseline':<16} {'train CE':>9} {'+-95%':>6} {'ROC-AUC':>8} {'+-95%':>6}")
for name, c in rows:
    print(f"{name:<16} {c['detector']:<16} {c['cross_entropy']:9.3f} {c['cross_entropy_ci']:6.3f} "
          f"{c['roc_auc']:8.3f} {c['roc_auc_ci']:6.3f}")
PY
