"""``assay zoo``: generate a TrojAI-style round of clean and trojaned image classifiers.

Parses options, calls the pillar, renders with rich. No computation lives here.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from assay.terminal import progress_bar
from assay.zoo.config import RoundConfig, load_round_config, with_overrides
from assay.zoo.round import BuildResult, generate_round

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
    base = load_round_config(config) if config is not None else RoundConfig()
    round_config = with_overrides(base, models=models, seed=seed)
    progress = progress_bar()
    with progress:
        task = progress.add_task("models", total=round_config.models)

        def on_done(result: BuildResult) -> None:
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
