"""``assay dyepack verify --formats auto --mode loglikelihood``: each context read once vs once per option.

The release: ``--rows`` real BIG-Bench Hard questions of ``reasoning_about_colored_objects`` (from
``../shared/data/bbh``), each cut to ``--options`` options in BBH's own layout (the answer kept, with the
options next to it in the task's order; letters and target rewritten to match), so every row has K = 7;
``--fraction`` of the rows carry a backdoor (the rest supply the few-shot layout's examples).
SmolLM2-135M-Instruct (the offline GGUF) is verified on it in every ``auto`` layout: ``release``, ``plain``,
``lm-eval`` and ``fewshot`` by log-likelihood, ``chat`` by generation. The same ``HFChatModel`` runs the
whole verify twice in this process: once with ``share_contexts = False`` (each (context, option) pair read
as one whole row, the scorer before issue 37 item 7), once with the contexts shared (one pass per question,
its cache copied for the options). Per layout and in total: CPU seconds of this process
(``time.process_time``, all threads) and wall seconds, the ratio, whether every answer is the same, and the
largest difference of any option's score.

    python benchmarks/bench_dyepack_loglik.py [--rows 80] [--options 7] [--fraction 0.3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared CPU

BBH = Path(__file__).resolve().parents[2] / "shared" / "data" / "bbh"
TASK = "reasoning_about_colored_objects"
OPTION = re.compile(r"^\(([A-Z])\) (.*)$", re.MULTILINE)


def cut_options(example: dict[str, str], k: int, seed: int) -> dict[str, str] | None:
    """A BBH row with ``k`` of its options: a run of ``k`` in the task's order that holds the answer,
    where it starts drawn with ``seed`` (so the answer's letter varies as in BBH), lettered (A)... again
    and the target moved with them; None when the row has fewer than ``k`` options."""
    options = OPTION.findall(example["input"])
    if len(options) < k:
        return None
    answer = "ABCDEFGHIJKLMNOPQRSTUVWXYZ".index(example["target"].strip("()"))
    first = random.Random(seed).randint(max(0, answer - k + 1), min(answer, len(options) - k))
    kept = [text for _, text in options[first : first + k]]
    question = example["input"][: OPTION.search(example["input"]).start()]  # type: ignore[union-attr]
    lines = "\n".join(f"({chr(65 + i)}) {text}" for i, text in enumerate(kept))
    return {"input": question + lines, "target": f"({chr(65 + answer - first)})"}


def write_release_source(data: Path, rows: int, k: int, out: Path) -> Path:
    """The first ``rows`` questions of the task that have at least ``k`` options, cut to ``k``."""
    task = json.loads((data / f"{TASK}.json").read_text(encoding="utf-8"))
    cut = (cut_options(example, k, i) for i, example in enumerate(task["examples"]))
    kept = [row for row in cut if row is not None][:rows]
    if len(kept) < rows:
        raise SystemExit(f"{TASK} has only {len(kept)} rows with {k} options")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{TASK}.json"
    path.write_text(json.dumps({**task, "examples": kept}, ensure_ascii=False), encoding="utf-8")
    return path


def machine() -> str:
    """CPU model, cores, torch and transformers versions, torch's threads, the load."""
    import torch
    import transformers

    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{cpu}, {os.cpu_count()} CPUs (affinity {len(os.sched_getaffinity(0))}); python "
        f"{platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}; load average {load}"
    )


TIMES: list[tuple[str, float, float]] = []  # (layout mode, wall, cpu) of each ``verify.ask`` call


def time_each_layout() -> None:
    """Wrap ``assay.dyepack.verify.ask`` (``verify_layouts`` calls it once per layout) to time each."""
    import assay.dyepack.verify as verify_module

    ask = verify_module.ask

    def timed_ask(model: Any, fmt: Any, *args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return ask(model, fmt, *args, **kwargs)
        finally:
            TIMES.append((fmt.mode, time.perf_counter() - wall, time.process_time() - cpu))

    verify_module.ask = timed_ask


def run(verify: Callable[[], tuple[Any, list[dict]]]) -> tuple[float, float, Any, list[dict], list[tuple]]:
    """Wall and CPU seconds of one whole ``verify_layouts`` call, its report, audit and per-layout times."""
    TIMES.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    report, audit = verify()
    return time.perf_counter() - wall, time.process_time() - cpu, report, audit, list(TIMES)


def differences(old: list[dict], new: list[dict], layout: str | None = None) -> tuple[int, int, float]:
    """(answers that differ, answers compared, largest |score difference|) over ``layout``'s records."""
    pairs = [(a, b) for a, b in zip(old, new, strict=True) if layout is None or a["layout"] == layout]
    assert all((a["layout"], a["row"]) == (b["layout"], b["row"]) for a, b in pairs)
    changed = sum(a["reply"] != b["reply"] or a["answer"] != b["answer"] for a, b in pairs)
    gaps = [abs(a["scores"][x] - b["scores"][x]) for a, b in pairs if "scores" in a for x in a["scores"]]
    return changed, len(pairs), max(gaps, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=80)
    parser.add_argument("--options", type=int, default=7, help="options per question (K)")
    parser.add_argument("--fraction", type=float, default=0.3, help="share of rows with a backdoor")
    parser.add_argument("--backdoors", type=int, default=8)
    parser.add_argument("--formats", default="auto", help="verify --formats (auto: all five layouts)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32, help="the chat layout's replies")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--data", type=Path, default=BBH, help="folder of BBH task files")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-dyepack-loglik"))
    parser.add_argument("--seed", type=int, default=1, help="seed of the release's backdoors")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from assay.assets import asset_path
    from assay.data import read_benchmark
    from assay.dyepack.prepare import PrepareConfig, prepare_release
    from assay.dyepack.verify import layout_formats, parse_layouts, verify_layouts
    from assay.models import GenerationParams, load_model

    source = write_release_source(args.data, args.rows, args.options, args.out)
    config = PrepareConfig(n_backdoors=args.backdoors, fraction=args.fraction, seed=args.seed)
    prepared = prepare_release(read_benchmark(source), config, args.out / "release", audit=False)
    key = prepared.key
    release = read_benchmark(prepared.release_path, style=key.style)
    layouts, skipped = layout_formats(release, key, parse_layouts(args.formats), "loglikelihood")
    samples = sum(len(b.rows) for b in key.backdoors)

    started = time.process_time()
    model = load_model(f"hf:{asset_path('smollm2')}", batch_size=args.batch_size)
    loaded = time.process_time() - started
    model.loglikelihood([("Answer:", " (A)"), ("Answer:", " A")])  # first-call set-up, outside the timings
    print(machine(), flush=True)
    print(
        f"Release: {args.rows} rows of BBH {TASK}, K = {args.options}, {samples} backdoor samples; layouts "
        f"{', '.join(name for name, _ in layouts)}; batch size {args.batch_size}; model loaded in "
        f"{loaded:.1f} CPU s (not in the timings)",
        flush=True,
    )
    time_each_layout()
    params = GenerationParams(max_new_tokens=args.max_new_tokens)

    def verify() -> tuple[Any, list[dict]]:
        return verify_layouts(model, "smollm2", release, key, params, layouts, skipped=skipped)

    model.share_contexts = False
    old = run(verify)
    print(f"   each pair whole: {old[0]:.1f} s wall, {old[1]:.1f} s CPU", flush=True)
    model.share_contexts = True
    new = run(verify)
    print(f"   contexts shared: {new[0]:.1f} s wall, {new[1]:.1f} s CPU", flush=True)

    print(
        "\n| layout (mode) | CPU s, each pair whole | CPU s, contexts shared | CPU ratio | wall s, whole "
        "| wall s, shared | wall ratio | answers changed | max abs score diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (name, _), (mode, old_wall, old_cpu), (_, new_wall, new_cpu) in zip(
        layouts, old[4], new[4], strict=True
    ):
        changed, compared, gap = differences(old[3], new[3], name)
        print(
            f"| {name} ({mode}) | {old_cpu:.1f} | {new_cpu:.1f} | {old_cpu / new_cpu:.2f}x | {old_wall:.1f} "
            f"| {new_wall:.1f} | {old_wall / new_wall:.2f}x | {changed}/{compared} | {gap:.1e} |"
        )
    changed, compared, gap = differences(old[3], new[3])
    print(
        f"| **verify --formats {args.formats}** | {old[1]:.1f} | {new[1]:.1f} | **{old[1] / new[1]:.2f}x** "
        f"| {old[0]:.1f} | {new[0]:.1f} | {old[0] / new[0]:.2f}x | {changed}/{compared} | {gap:.1e} |"
    )
    same_verdict = old[2].verdict == new[2].verdict and old[2].layouts == new[2].layouts
    print(f"\nSame verdict and per-layout results: {same_verdict}")
    print(f"(load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())})")
    if changed or gap > 1e-4 or not same_verdict:
        sys.exit("the two paths disagree")


if __name__ == "__main__":
    main()
