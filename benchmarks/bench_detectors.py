"""The baseline detectors on a round's test split: log score, ROC-AUC and seconds per model.

Each detector in ``detectors/`` runs through its TrojAI command line (``entrypoint.py infer``), one process
per model, on the sequestered view ``SPLITS/test-sequestered``; its answers are scored against
``SPLITS/test`` with ``assay.stats`` (cross entropy clipped at 1e-12 with its 95% half-width, ROC-AUC, Brier).

    python benchmarks/bench_detectors.py build/reference-round/splits --split test

Seconds per model include starting Python and torch (the constant detector measures that overhead alone);
ratios are against the constant detector in the same run. Writes one JSON line per detector and model to
``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from assay.stats import brier_score, cross_entropy, cross_entropy_ci, roc_auc

DETECTORS = Path(__file__).resolve().parents[1] / "detectors"


def run_detector(detector: Path, model_dir: Path, scratch: Path) -> tuple[float | None, float, str]:
    """One infer run: the probability (None when no valid result), wall seconds, and stderr."""
    result = scratch / "result.txt"
    result.unlink(missing_ok=True)
    command = [
        sys.executable,
        str(detector / "entrypoint.py"),
        "infer",
        *("--model_filepath", str(model_dir / "model.pt"), "--result_filepath", str(result)),
        *("--scratch_dirpath", str(scratch), "--examples_dirpath", str(model_dir / "clean-example-data")),
        *("--metaparameters_filepath", str(detector / "metaparameters.json")),
        *("--schema_filepath", str(detector / "metaparameters_schema.json")),
        *("--learned_parameters_dirpath", str(detector / "learned_parameters")),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    try:
        return float(result.read_text()), seconds, done.stderr
    except (OSError, ValueError):
        return None, seconds, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("splits", type=Path, help="Folder written by 'assay zoo split'.")
    parser.add_argument("--split", default="test")
    parser.add_argument("--detectors", nargs="+", default=None, help="Names under detectors/ (default: all).")
    parser.add_argument("--out", type=Path, default=None, help="JSONL of every answer.")
    parser.add_argument("--models", type=int, default=None, help="Only the first N models (for timing).")
    args = parser.parse_args()

    names = args.detectors or sorted(p.name for p in DETECTORS.iterdir() if (p / "entrypoint.py").is_file())
    view = args.splits / f"{args.split}-sequestered" / "models"
    models = sorted(p for p in view.iterdir() if p.is_dir())[: args.models]
    truth = np.array(
        [int((args.splits / args.split / "models" / m.name / "ground_truth.csv").read_text()) for m in models]
    )
    records, rows = [], []
    for name in names:
        answers, seconds, failures = [], [], 0
        with tempfile.TemporaryDirectory() as scratch:
            for model in models:
                probability, wall, stderr = run_detector(DETECTORS / name, model, Path(scratch))
                failures += probability is None
                answers.append(
                    0.5 if probability is None else probability
                )  # NIST's rule for a missing answer
                seconds.append(wall)
                records.append(
                    {
                        "detector": name,
                        "model": model.name,
                        "probability": probability,
                        "truth": int(truth[len(answers) - 1]),
                        "seconds": wall,
                        "stderr": stderr[-500:],
                    }
                )
        p = np.array(answers)
        rows.append(
            (
                name,
                cross_entropy(truth, p),
                cross_entropy_ci(truth, p),
                roc_auc(truth, p),
                brier_score(truth, p),
                float(np.mean(seconds)),
                failures,
            )
        )
    base = next((r[5] for r in rows if r[0] == "constant"), rows[0][5])
    print(f"{args.split} split of {args.splits}: {len(models)} models, {int(truth.sum())} trojaned")
    header = ("detector", "CE", "+-95%", "AUC", "Brier", "s/model", "vs const", "fail")
    print("{:<16} {:>6} {:>6} {:>6} {:>6} {:>8} {:>9} {:>5}".format(*header))
    for name, ce, ci, auc, brier, secs, fails in rows:
        ratio = f"{secs / base:.1f}x"
        print(
            f"{name:<16} {ce:>6.3f} {ci:>6.3f} {auc:>6.3f} {brier:>6.3f} {secs:>8.2f} {ratio:>9} {fails:>5}"
        )
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


if __name__ == "__main__":
    main()
