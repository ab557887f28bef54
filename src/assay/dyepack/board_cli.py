"""``assay dyepack board``: the contamination board from the command line (the same database as the web).

Parses options, calls ``assay.dyepack.board``, renders with rich. Imports of the store and the pillar wait
until a command runs, so ``assay dyepack --help`` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from assay.dyepack.fpr import DEFAULT_ALPHA  # fpr.py, not the verifier: no pydantic for the help
from assay.errors import UserError

app = typer.Typer(
    help="The contamination board: every registered model checked against every registered release.\n\n"
    "Example: assay dyepack board run --keys ~/dyepack-keys",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)
DbUrl = Annotated[
    str | None, typer.Option("--db", help="Database URL (default: ASSAY_DB_URL or SQLite under ASSAY_HOME).")
]
STYLES = {"flagged": "bold red", "clear": "green", "pending": "dim", "failed": "yellow"}


def _sessions(db: str | None):  # type: ignore[no-untyped-def]
    from assay.store.engine import open_store

    return open_store(db)


@app.command("add-release")
def add_release(
    commitment: Path = typer.Argument(..., help="The release's commitment.txt, or the folder holding it."),
    name: str = typer.Option(..., "--name", help="Name shown as the board's column."),
    description: str = typer.Option("", help="A line about the release."),
    url: str = typer.Option("", help="Where the release is published (http or https)."),
    db: DbUrl = None,
) -> None:
    """Register a release by its published commitment (the key stays with you).

    Example: assay dyepack board add-release release/commitment.txt --name mmlu-2026
    """
    from assay.dyepack import registry

    path = commitment / "commitment.txt" if commitment.is_dir() else commitment
    if not path.is_file():
        raise UserError(f"{path}: commitment file not found")
    with _sessions(db).begin() as session:
        benchmark = registry.register_benchmark(
            session, name, path.read_text(encoding="utf-8"), description, url
        )
        console.print(
            f"registered release [bold]{benchmark.name}[/] (commitment {benchmark.commitment[:16]}...)"
        )


@app.command("add-model")
def add_model(
    name: str = typer.Argument(..., help="Name shown as the board's row."),
    spec: str = typer.Argument(
        ..., help="hf:PATH (folder or .gguf), openai:BASE_URL, vllm:PATH, python:MOD:FUNC."
    ),
    model_name: str = typer.Option("", help="openai: the served model's name (default: the only one)."),
    api_key_env: str = typer.Option(
        "", help="openai: NAME of the environment variable holding the API key (the key is never stored)."
    ),
    mode: str = typer.Option("chat", help="How the model is used: chat, completion or loglikelihood."),
    template: Path | None = typer.Option(
        None, help="Jinja2 template of one example (see verify --template)."
    ),
    fewshot: int = typer.Option(0, help="Few-shot examples from each release's rows without a backdoor."),
    system_prompt: str = typer.Option("", help="A system prompt (chat) or preamble (text modes)."),
    by: str = typer.Option("", "--by", help="Who adds it (default: your login name)."),
    db: DbUrl = None,
) -> None:
    """Put a model on the board; it is pending against every release until `board run` checks it.

    Example: assay dyepack board add-model smollm2-base hf:./smollm2 --mode loglikelihood --fewshot 5
    """
    from assay.dyepack import board
    from assay.dyepack.prompts import Template

    loaded = Template.from_file(template) if template is not None else None
    with _sessions(db).begin() as session:
        model = board.add_model(
            session,
            name,
            spec,
            model_name=model_name,
            api_key_env=api_key_env,
            mode=mode,
            fewshot=fewshot,
            system_prompt=system_prompt,
            template=loaded,
            added_by=by,
        )
        console.print(
            f"added model [bold]{model.name}[/] ({model.kind}, asked by {board.planned_format(model)})"
        )


@app.command("run")
def run(
    keys: Path = typer.Option(
        ..., "--keys", help="Folder of your keys (searched recursively; matched by commitment)."
    ),
    releases: list[Path] = typer.Option(
        [], "--releases", help="Folder to look for release files in (default: beside each key)."
    ),
    alpha: float = typer.Option(DEFAULT_ALPHA, help="Flag when the false-positive rate is at most alpha."),
    max_new_tokens: int = typer.Option(32, help="Tokens to generate per reply."),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Also check again the cells whose check failed (not retried otherwise)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the board as JSON when done."),
    db: DbUrl = None,
) -> None:
    """Check every model against every release it has not been checked against, here and now.

    The keys are read into memory for this command only; nothing of them is stored. A failed check is
    tried again only with --retry-failed; a model that cannot be asked leaves with `board drop`.

    Example: assay dyepack board run --keys ~/dyepack-keys --releases ~/releases
    """
    from assay.dyepack import board
    from assay.models import GenerationParams
    from assay.terminal import progress_bar

    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be in (0, 1) (value: {alpha})")
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1 (value: {max_new_tokens})")
    sessions = _sessions(db)
    held = board.keys_in(keys)
    with sessions() as session:
        plans = board.plan_checks(
            session, held, releases, alpha, GenerationParams(max_new_tokens=max_new_tokens), retry_failed
        )
    say = Console(stderr=True, soft_wrap=True).print if as_json else console.print  # --json: stdout is JSON
    for plan in plans:
        if plan.waiting:
            say(f"[yellow]{plan.release}:[/] {plan.waiting}")
    total = sum(len(p.jobs) for p in plans)
    with progress_bar() as bar:
        task = bar.add_task("checking", total=total)
        ran = set(board.check_pending(sessions, plans, lambda _run_id: bar.advance(task)))
    with sessions() as session:
        matrix = board.build_board(session)
    if as_json:
        typer.echo(matrix.model_dump_json(indent=2))
        return
    failed = sum(c.state == "failed" and c.run_id in ran for row in matrix.cells for c in row)
    failures = f", {failed} failed (again with --retry-failed, or `board drop MODEL`)" if failed else ""
    say(f"checked {total} cell{'' if total == 1 else 's'}{failures}")
    show_board(matrix)


@app.command("drop")
def drop(
    name: str = typer.Argument(..., help="The model's name on the board."),
    db: DbUrl = None,
) -> None:
    """Take a model off the board (its past checks stay in the registry as plain runs).

    Example: assay dyepack board drop broken-endpoint
    """
    from assay.dyepack import board

    with _sessions(db).begin() as session:
        board.drop_model(session, board.model_named(session, name))
    console.print(f"dropped model [bold]{name}[/] from the board", highlight=False)


@app.command("show")
def show(
    as_json: bool = typer.Option(False, "--json", help="Print the board as JSON."),
    db: DbUrl = None,
) -> None:
    """The matrix: per model and release, activated/total, exact FPR and format.

    Example: assay dyepack board show --json
    """
    from assay.dyepack import board

    with _sessions(db)() as session:
        matrix = board.build_board(session)
    if as_json:
        typer.echo(matrix.model_dump_json(indent=2))
    else:
        show_board(matrix)


@app.command("export")
def export(
    out: Path = typer.Argument(..., help="Folder for board.html, board.csv and board.json."),
    db: DbUrl = None,
) -> None:
    """Write the board as a self-contained HTML page, a CSV of cells and JSON, to publish as they are.

    Example: assay dyepack board export site/board
    """
    from assay.dyepack import board
    from assay.dyepack.board_export import write_export

    with _sessions(db)() as session:
        paths = write_export(board.build_board(session), out)
    console.print("wrote " + ", ".join(str(p) for p in paths))


def show_board(matrix) -> None:  # type: ignore[no-untyped-def]
    """A rich table: a row per model, a column per release."""
    from assay.dyepack.board_export import verdict

    table = Table(title="DyePack contamination board")
    table.add_column("model")
    for release in matrix.releases:
        table.add_column(release.name)
    for model, row in zip(matrix.models, matrix.cells, strict=True):
        cells = []
        for cell in row:
            style = STYLES.get(
                ("flagged" if cell.flagged else "clear") if cell.state == "done" else cell.state, ""
            )
            text = f"[{style}]{verdict(cell)}[/]" if style else verdict(cell)
            if cell.state == "done":
                text += f"\n{cell.activated}/{cell.backdoors} · FPR {cell.fpr_text}\n{cell.format}"
            elif cell.error:
                text += f"\n{cell.error[:200]}"
            cells.append(text)
        table.add_row(f"[bold]{model.name}[/]\n{model.spec}\n{model.kind} · {model.format}", *cells)
    console.print(table)
    console.print(
        f"{matrix.flagged} flagged, {matrix.pending} pending (`assay dyepack board run --keys DIR`), "
        f"{matrix.failed} failed (`--retry-failed`, or `assay dyepack board drop MODEL`)"
    )
