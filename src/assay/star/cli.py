"""``assay star``: STAR red-teaming campaigns (design now; participants, assignment and analysis later).

Parses options, calls the pillar, renders with rich. No computation lives here.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from assay.star.design import DesignTable, design_table, draw_design, write_instructions
from assay.star.spec import CampaignSpec, load_spec

app = typer.Typer(
    help="STAR red teaming: parametric instructions that cover a risk surface evenly.\n\n"
    "Example: assay star design examples/star-campaign.yaml --count 120 --seed 1 --out instructions.jsonl",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)


@app.callback()
def star() -> None:
    """STAR red teaming: parametric instructions that cover a risk surface evenly."""


@app.command()
def design(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Campaign spec YAML."),
    out: Path = typer.Option(..., "--out", "-o", help="Instructions JSONL to write."),
    count: int | None = typer.Option(None, "--count", "-n", min=1, help="Instructions (default: dialogues)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed: the same seed gives the same design."),
    json_out: bool = typer.Option(False, "--json", help="Print counts and warnings as JSON instead."),
) -> None:
    """Draw a balanced, randomised design of instructions and show how many dialogues each cell gets.

    Example: assay star design examples/star-campaign.yaml --count 120 --seed 1 --out instructions.jsonl
    """
    spec = load_spec(spec_path)
    instructions = draw_design(spec, spec.dialogues if count is None else count, seed)
    table = design_table(spec, instructions)
    write_instructions(out, instructions)
    if json_out:
        summary = {"spec": str(spec_path), "out": str(out), "seed": seed, **table.model_dump()}
        console.print_json(json.dumps(summary))
        return
    _print_table(spec, table)
    console.print(f"{table.count} instructions written to {out} (seed {seed})", highlight=False)
    for line in table.warnings:
        errors.print(f"[yellow]warning:[/] {line}", highlight=False)


def _counts(title: str, header: str, counts: dict[str, int]) -> Table:
    """A two-column table: each cell and the dialogues it gets."""
    table = Table(title=title, title_justify="left")
    table.add_column(header)
    table.add_column("dialogues", justify="right")
    for name, n in counts.items():
        table.add_row(name, str(n))
    return table


def _grid(title: str, rows: list[str], columns: list[str], cell: dict[tuple[str, str], int]) -> Table:
    """A rows x columns table of dialogue counts (rule x parameter value, rule x group, ...)."""
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row, *(str(cell.get((row, column), 0)) for column in columns))
    return table


def _print_table(spec: CampaignSpec, table: DesignTable) -> None:
    """The design as rich tables: per rule, per parameter, rule x parameter, rule x group, attribute pairs."""
    areas = {rule.id: rule.area for rule in spec.rules}
    console.print(_counts("Rules", "rule", {f"{r} ({areas[r]})": n for r, n in table.rules.items()}))
    for name, counts in table.parameters.items():
        console.print(_counts(f"Parameter {name}", name, counts))
    if len(table.templates) > 1:
        console.print(_counts("Templates", "template", table.templates))
    rows = [f"{name}={value}" for name, values in spec.parameters.items() for value in values]
    rule_ids = list(table.rules)
    cells = {
        (f"{name}={value}", rule_id): n
        for rule_id, by_parameter in table.rule_parameters.items()
        for name, counts in by_parameter.items()
        for value, n in counts.items()
    }
    console.print(_grid("Rule x parameter", rows, rule_ids, cells))
    if table.rule_groups:
        targeted = list(table.rule_groups)
        labels = list(next(iter(table.rule_groups.values())))
        by_group = {(label, r): n for r, counts in table.rule_groups.items() for label, n in counts.items()}
        console.print(_grid("Rule x target group", labels, targeted, by_group))
    for rule_id, by_pair in table.attribute_pairs.items():
        for pair, counts in by_pair.items():
            a, b = pair.split(" x ")
            attributes = spec.demographics.attributes
            grid = {
                (f"{a}={u}", f"{b}={v}"): counts[f"{a}={u} x {b}={v}"]
                for u in attributes[a]
                for v in attributes[b]
            }
            title = f"Rule {rule_id}: {pair}"
            console.print(
                _grid(title, [f"{a}={u}" for u in attributes[a]], [f"{b}={v}" for v in attributes[b]], grid)
            )
