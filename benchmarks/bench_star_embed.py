"""Dialogue embedding throughput for the STAR thematic map: all-MiniLM-L6-v2 on CPU vs the hashing baseline.

Dialogues come from the HH-RLHF harmless-base test split (``../shared/data/hh-rlhf``, the rejected side, as
"User: ... / Assistant: ..." text, truncated to 256 tokens by MiniLM); without that file a synthetic set of
dialogues of similar length stands in. The model is loaded and warmed up before timing. The cached rows time
``embed_texts`` through an ``EmbeddingCache`` (SQLite in a temp folder): the first pass encodes and stores,
the second only reads.

    python benchmarks/bench_star_embed.py --dialogues 512 --batch-sizes 16 64

Prints a markdown table; ratios are dialogues/s against the hashing embedder in the same process.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch loads its OpenMP runtime

HH_RLHF = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
)


def dialogues(count: int) -> tuple[list[str], str]:
    """``count`` dialogue texts and where they came from."""
    from assay.star.analysis import dialogue_text

    if HH_RLHF.exists():
        from assay.star.exchange import import_hh_rlhf

        rows = import_hh_rlhf(HH_RLHF, limit=count)
        return [dialogue_text(row["turns"]) for row in rows], f"HH-RLHF harmless-base test ({HH_RLHF.name})"
    import numpy as np

    rng = np.random.default_rng(0)
    words = [
        "how",
        "can",
        "I",
        "make",
        "the",
        "best",
        "weapon",
        "recipe",
        "money",
        "doctor",
        "pill",
        "friend",
        "neighbour",
        "steal",
        "help",
    ]
    texts = []
    for _ in range(count):
        turns = [
            f"{role}: {' '.join(rng.choice(words, size=rng.integers(8, 40)))}"
            for role in ("User", "Assistant")
        ]
        texts.append("\n".join(turns * int(rng.integers(1, 4))))
    return texts, "synthetic (HH-RLHF not found)"


def rate(encode, texts: list[str]) -> float:
    """Dialogues per second for one call of ``encode`` over all texts."""
    start = time.perf_counter()
    encode(texts)
    return len(texts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dialogues", type=int, default=512)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()

    import torch

    from assay.star.analysis import EmbeddingCache, HashingEmbedder, MiniLMEmbedder, embed_texts

    texts, origin = dialogues(args.dialogues)
    hashing = HashingEmbedder()
    hashing.encode(texts[:8])
    rows = [("hashing-4096", "-", rate(hashing.encode, texts))]
    minilm = MiniLMEmbedder()
    minilm.encode(texts[:8])  # load and warm up outside the timing
    for batch in args.batch_sizes:
        minilm.batch_size = batch
        rows.append((minilm.name, str(batch), rate(minilm.encode, texts)))
    minilm.batch_size = args.batch_sizes[-1]
    with tempfile.TemporaryDirectory() as folder, EmbeddingCache(Path(folder) / "cache.sqlite") as cache:
        rows.append(
            (
                f"{minilm.name} + cache, cold",
                str(minilm.batch_size),
                rate(lambda t: embed_texts(t, minilm, cache), texts),
            )
        )
        rows.append(
            (f"{minilm.name} + cache, warm", "-", rate(lambda t: embed_texts(t, minilm, cache), texts))
        )

    words = sum(len(t.split()) for t in texts) / len(texts)
    print(f"{len(texts)} dialogues, {origin}, {words:.0f} words each on average")
    print(f"CPU: {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} threads")
    print()
    print("| embedder | batch | dialogues/s | vs hashing |")
    print("|---|---:|---:|---:|")
    base = rows[0][2]
    for name, batch, speed in rows:
        print(f"| {name} | {batch} | {speed:,.1f} | {speed / base:.3f}x |")


if __name__ == "__main__":
    main()
