"""``assay zoo``: generate, split, import, export and measure TrojAI-style rounds (image or text models).

Parses options, calls the pillar, renders with rich. No computation lives here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from assay.terminal import progress_bar

app = typer.Typer(
    help="Model zoo: generate rounds of clean and trojaned models (TrojAI layout).\n\n"
    "Example: assay zoo generate --config examples/zoo-round.yaml --out round0/",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)


@app.command()
def generate(
    out: Path = typer.Option(..., "--out", "-o", help="Round folder: models/, METADATA.csv."),
    config: Path | None = typer.Option(None, "--config", "-c", help="Round config YAML (default: defaults)."),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="Training processes."),
    executor: str = typer.Option("local", "--executor", help="local (--workers processes) or ray."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (with --executor ray)."),
    models: int | None = typer.Option(None, "--models", help="Override the number of models."),
    seed: int | None = typer.Option(None, "--seed", help="Override the round seed."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Generate (or resume) a round: existing model folders are kept, missing ones are trained.

    Example: assay zoo generate --config examples/zoo-round.yaml --out round0/ --workers 2
    """
    from assay.runner.executors import RayExecutor, make_executor  # ray itself: only with --executor ray
    from assay.zoo.config import RoundConfig, load_round_config, with_overrides  # torch: only when used
    from assay.zoo.round import generate_round

    chosen = make_executor(executor, workers, address)  # the same words as 'assay leaderboard worker'
    cluster = chosen if isinstance(chosen, RayExecutor) else None
    base = load_round_config(config) if config is not None else RoundConfig()
    round_config = with_overrides(base, models=models, seed=seed)
    progress = progress_bar()
    with progress:
        task = progress.add_task("models", total=round_config.models)

        def on_done(result: Any) -> None:  # a zoo.round.BuildResult
            progress.advance(task)

        summary = generate_round(round_config, out, workers=workers, on_done=on_done, cluster=cluster)
    if json_out:
        console.print_json(summary.model_dump_json())
    else:
        console.print(
            f"{summary.models} models in {summary.out_dir}: {summary.built} built, "
            f"{summary.skipped} skipped, {summary.rejected_attempts} rejected attempts",
            highlight=False,
        )


@app.command()
def split(
    round_dir: Path = typer.Argument(
        ...,
        help="Round folder with METADATA.csv (a poisoned column) and models/, e.g. from 'import-nist'.",
    ),
    train: float = typer.Option(0.5, "--train", help="Share of models for training (performers get all)."),
    test: float = typer.Option(0.3, "--test", help="Share for the test split (sequestered)."),
    holdout: float = typer.Option(0.2, "--holdout", help="Share for the holdout split (sequestered)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the stratified split."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output folder (default: ROUND_DIR/splits)."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Split a round into train/test/holdout, stratified by poisoned and main factors, with sequestered views.

    Example: assay zoo split round0/ --train 0.5 --test 0.3 --holdout 0.2 --seed 1
    """
    fractions = {"train": train, "test": test, "holdout": holdout}
    from assay.zoo.split import split_round

    summary = split_round(round_dir, fractions, seed=seed, out_dir=out)
    if json_out:
        console.print_json(summary.model_dump_json())
        return
    for name, count in summary.counts.items():
        console.print(f"{name}: {count} models ({summary.poisoned[name]} poisoned)", highlight=False)
    console.print(f"written to {summary.out_dir}", highlight=False)


@app.command("import-nist")
def import_nist(
    round_dir: Path = typer.Argument(
        ...,
        help="NIST round: METADATA.csv and models/id-*/ (or train-dataset/, test-dataset/ and "
        "holdout-dataset/ folders).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Output: a split folder, or a round to split."),
    assignment: Path | None = typer.Option(
        None,
        "--assignment",
        "-a",
        help="Train/test/holdout per model: CSV model_name,data_split or JSON (model -> split, or "
        "split.json). Default: a data_split/split column of METADATA.csv, or NIST's per-split folders.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Import a round laid out as NIST publishes it (jpg + json examples, METADATA.csv, ground_truth.csv).

    With a train/test/holdout assignment OUT is what 'assay zoo split' writes, ready for
    'assay leaderboard round create --dataset OUT'; without one OUT is a round for 'assay zoo split OUT'.

    Example: assay zoo import-nist round11-train-dataset/ --out r11/ && assay zoo split r11/
    """
    from assay.zoo.nist import import_round

    summary = import_round(round_dir, out, assignment)
    if json_out:
        console.print_json(summary.model_dump_json())
        return
    console.print(f"{summary.models} models ({summary.poisoned} poisoned) imported", highlight=False)
    if summary.unlisted:
        console.print(
            f"{len(summary.unlisted)} model folder(s) not in METADATA.csv left out, "
            f"first {summary.unlisted[0]}",
            highlight=False,
        )
    if summary.split:
        counts = ", ".join(f"{name} {count}" for name, count in summary.counts.items())
        console.print(f"split from {summary.assignment_from}: {counts}", highlight=False)
        console.print(
            f"written to {out}; next: assay leaderboard round create NAME --dataset {out}", highlight=False
        )
    else:
        console.print(f"written to {out}; no split given, next: assay zoo split {out}", highlight=False)


@app.command("export-nist")
def export_nist(
    source: Path = typer.Argument(..., help="A round (METADATA.csv) or an 'assay zoo split' folder."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder in NIST's layout."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Write a round in NIST's layout: models/id-*/ with RGB .jpg + .json examples, NIST-named METADATA.csv.

    model.pt (and model.safetensors) are copied as they are; a split folder becomes one round whose
    METADATA.csv has NIST's data_split column, so 'import-nist' gives the same split back.

    Example: assay zoo export-nist r1/splits --out r1-nist/
    """
    from assay.zoo.nist import export_round

    summary = export_round(source, out)
    if json_out:
        console.print_json(summary.model_dump_json())
        return
    splits = ", ".join(f"{name} {count}" for name, count in summary.splits.items())
    console.print(
        f"{summary.models} models ({summary.poisoned} poisoned; {splits}), {summary.examples} example "
        f"images written to {summary.out_dir}",
        highlight=False,
    )


@app.command()
def difficulty(
    round_dir: Path = typer.Argument(
        ..., help="A round, an 'assay zoo split' folder or a round with splits/."
    ),
    detector: list[Path] = typer.Option(
        [],
        "--detector",
        "-d",
        help="A TrojAI detector folder (repeat); default: the baselines for the domain.",
    ),
    detectors_dir: Path = typer.Option(
        Path("detectors"),
        "--detectors-dir",
        help="Where the default baselines are (constant, meta_classifier, text_meta).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """How hard a round is before it opens: the baselines cross-validated on its training split, scored
    per round and per factor (architecture, trigger kind, poison fraction, source-specific).

    Example: assay zoo difficulty r1/ --detectors-dir detectors/
    """
    from assay.zoo.difficulty import difficulty as measure

    with console.status("running the baselines on the training split"):
        report = measure(round_dir, detector or None, detectors_dir)
    if json_out:
        console.print_json(report.model_dump_json())
        return
    from assay.terminal import plain_table

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    headers = ("detector", "factor", "value", "models", "trojaned", "CE", "+-95%", "ROC-AUC", "+-95%")
    rows = [
        [c.detector, c.factor, c.value, str(c.models), str(c.trojaned)]
        + [number(v) for v in (c.cross_entropy, c.cross_entropy_ci, c.roc_auc, c.roc_auc_ci)]
        for c in report.cells
    ]
    console.print(
        f"{report.training_split}: {report.models} models ({report.trojaned} trojaned)", highlight=False
    )
    console.print(plain_table(headers, rows), highlight=False)
