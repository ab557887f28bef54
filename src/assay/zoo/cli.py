"""``assay zoo``: generate a TrojAI-style round of clean and trojaned image classifiers.

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
    models: int | None = typer.Option(None, "--models", help="Override the number of models."),
    seed: int | None = typer.Option(None, "--seed", help="Override the round seed."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Generate (or resume) a round: existing model folders are kept, missing ones are trained.

    Example: assay zoo generate --config examples/zoo-round.yaml --out round0/ --workers 2
    """
    from assay.zoo.config import RoundConfig, load_round_config, with_overrides  # torch: only when used
    from assay.zoo.round import generate_round

    base = load_round_config(config) if config is not None else RoundConfig()
    round_config = with_overrides(base, models=models, seed=seed)
    progress = progress_bar()
    with progress:
        task = progress.add_task("models", total=round_config.models)

        def on_done(result: Any) -> None:  # a zoo.round.BuildResult
            progress.advance(task)

        summary = generate_round(round_config, out, workers=workers, on_done=on_done)
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
    round_dir: Path = typer.Argument(..., help="Round folder made by 'assay zoo generate'."),
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
