"""DyePack stealth on BIG-Bench Hard: how well the audit tells backdoor rows apart, per task and placement.

For every multiple-choice BBH task file in a folder (default ``../shared/data/bbh``), draws ``--releases``
releases (B = 8, fraction 0.1, seeds 0..n-1) in three ways and audits each draw:

- ``end``: the trigger appended to the question, no other row touched (assay before issue 16);
- ``natural``: the trigger where a sentence reads naturally, no other row touched (``--cover 0``);
- ``natural+cover`` (the default): also every other row carries an unused phrase the same way.

Per task and way: the held-out classifier's mean AUC over the draws, its standard deviation and how many
draws exceed 0.6; how many draws the audit warns about; the classifier's mean AUC when it has seen other
samples of each trigger (the key-holder's view); the rule with the largest mean AUC; backdoor rows whose
trigger does not stand as a sentence. For the default way, ``kept``: the classifier AUC of the release
``prepare`` keeps (it draws afresh, up to 3 more times, while the audit does not pass), as mean and max.

    python benchmarks/bench_dyepack_stealth.py --releases 10 [--data ../shared/data/bbh]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

WAYS = {"end": ("end", 0.0), "natural": ("auto", 0.0), "natural+cover": ("auto", 1.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/bbh"))
    parser.add_argument("--releases", type=int, default=10)
    parser.add_argument("--backdoors", type=int, default=8)
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated subset of the ways")
    args = parser.parse_args()

    from assay.data import read_benchmark
    from assay.dyepack.audit import audit_items
    from assay.dyepack.prepare import PrepareConfig, draw_release, make_rng, plan_release
    from assay.dyepack.triggers import Position
    from assay.errors import UserError

    if not args.data.is_dir():
        raise SystemExit(f"{args.data}: no BBH folder (see ../shared/data/README.md)")
    print(f"{'task':40} {'way':13} {'clf AUC':>7} {'sd':>5} {'>0.6':>4} {'warned':>6} {'known':>5} "
          f"{'top rule (mean AUC)':>29} {'bad joins':>9} {'kept mean/max':>13} {'s/audit':>7}")  # fmt: skip
    started = time.perf_counter()
    for path in sorted(args.data.glob("*.json")):
        try:
            bench = read_benchmark(path)
        except UserError:
            continue  # a free-form task: no options, nothing for DyePack's multiple choice
        for way in args.ways.split(","):
            how, cover = WAYS[way]
            audits, clock = [], time.perf_counter()
            for seed in range(args.releases):
                config = PrepareConfig(
                    n_backdoors=args.backdoors, seed=seed, position=Position(how=how), cover=cover
                )
                plan = plan_release(bench, config, make_rng(seed))
                audits.append(audit_items(plan.items, plan.backdoors))
            per_audit = (time.perf_counter() - clock) / args.releases
            kept = "-"
            if way == "natural+cover":
                finals = []
                for seed in range(args.releases):
                    config = PrepareConfig(n_backdoors=args.backdoors, seed=seed)
                    finals.append(draw_release(bench, config, audit=True, redraws=3)[1].classifier.auc)
                kept = f"{np.mean(finals):.2f}/{max(finals):.2f}"
            clf = np.array([a.classifier.auc for a in audits if a.classifier])
            rules = {r.name: np.mean([a.rules[i].auc for a in audits]) for i, r in enumerate(audits[0].rules)}
            top = max(rules, key=rules.__getitem__)
            print(
                f"{path.stem:40} {way:13} {clf.mean():7.2f} {clf.std():5.2f} {(clf > 0.6).sum():>4} "
                f"{sum(not a.stealthy for a in audits):>6} "
                f"{np.mean([a.known_trigger_auc for a in audits]):5.2f} "
                f"{top[:24]:>24} {rules[top]:.2f} {sum(len(a.broken_joins) for a in audits):>9} "
                f"{kept:>13} {per_audit:7.1f}",
                flush=True,
            )
    print(f"{args.releases} releases per task and way, B = {args.backdoors}, fraction 0.1; "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
