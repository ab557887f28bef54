"""``assay star``: STAR red-teaming campaigns: design, participants, assignment, rehearsal, export.

Parses options, calls the pillar, renders with rich. No computation lives here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from assay.errors import UserError
from assay.lazy import lazy_module
from assay.terminal import progress_bar

if TYPE_CHECKING:  # imported lazily at run time: `assay star --help` loads no pandas
    from assay.star.analysis.reliability import AlphaEstimate

# The pillar, imported when a command first uses it: `assay star --help` pays for none of it.
np = lazy_module("numpy")
agreement_module = lazy_module("assay.stats.agreement")
assign_module = lazy_module("assay.star.assign")
choice = lazy_module("assay.models.choice")
design_module = lazy_module("assay.star.design")
engine = lazy_module("assay.store.engine")
exchange = lazy_module("assay.star.exchange")
models = lazy_module("assay.models")
model_base = lazy_module("assay.models.base")
participants = lazy_module("assay.star.participants")
planning = lazy_module("assay.star.planning")
ratings_module = lazy_module("assay.star.ratings")
simulate_module = lazy_module("assay.star.simulate")
seeds_module = lazy_module("assay.star.seeds")
embed_module = lazy_module("assay.star.analysis.embed")
spec_module = lazy_module("assay.star.spec")
status_module = lazy_module("assay.star.status")
store_models = lazy_module("assay.store.models")
workflow = lazy_module("assay.star.workflow")

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
    spec = spec_module.load_spec(spec_path)
    instructions = design_module.draw_design(spec, spec.dialogues if count is None else count, seed)
    table = design_module.design_table(spec, instructions)
    design_module.write_instructions(out, instructions)
    power_warnings = planning.plan_power(spec, dialogues=table.count).warnings()
    if json_out:
        summary = {"spec": str(spec_path), "out": str(out), "seed": seed, **table.model_dump()}
        console.print_json(json.dumps({**summary, "power_warnings": power_warnings}))
        return
    _print_table(spec, table)
    console.print(f"{table.count} instructions written to {out} (seed {seed})", highlight=False)
    for line in table.warnings:
        errors.print(f"[yellow]warning:[/] {line}", highlight=False)
    _print_warnings(power_warnings)


def _print_warnings(lines: list[str]) -> None:
    """Warnings on stderr, one line each: the command went ahead, but something deserves a look."""
    for line in lines:
        errors.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)


@app.command("plan-power")
def plan_power(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Campaign spec YAML."),
    pool: Path | None = typer.Option(None, "--pool", help="Pool CSV or YAML: who may take each side."),
    count: int | None = typer.Option(None, "--count", "-n", min=1, help="Dialogues (default: the spec's)."),
    baseline: float | None = typer.Option(None, "--baseline", help="'Broken' share on the out-group side."),
    odds_ratio: float | None = typer.Option(None, "--odds-ratio", help="Effect as an odds ratio."),
    difference: float | None = typer.Option(None, "--difference", help="Effect as a difference in shares."),
    alpha: float | None = typer.Option(None, "--alpha", help="Significance level (two-sided)."),
    power: float | None = typer.Option(None, "--power", help="Power wanted."),
    icc: float | None = typer.Option(None, "--icc", help="Correlation of two ratings of one dialogue."),
    person_icc: float = typer.Option(
        0.0, "--person-icc", min=0.0, max=1.0, help="Correlation of one person's outcomes (with --pool)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """How many group-targeted dialogues each in-group vs out-group test needs, and whether the plan has them.

    Effect, alpha, power and icc default to the spec's `power` block. Example:
    assay star plan-power examples/star-campaign.yaml --pool pool.csv --baseline 0.3 --odds-ratio 2
    """
    from pydantic import ValidationError

    from assay.errors import validation_error

    spec = spec_module.load_spec(spec_path)
    if odds_ratio is not None and difference is not None:
        raise UserError("give --odds-ratio or --difference, not both")
    given = {"baseline": baseline, "alpha": alpha, "power": power, "icc": icc}
    given = {k: v for k, v in given.items() if v is not None}
    if odds_ratio is not None or difference is not None:
        given |= {"odds_ratio": odds_ratio, "difference": difference}
    try:
        target = spec.power.model_validate(spec.power.model_dump() | given)
    except ValidationError as exc:
        raise validation_error(exc, "plan-power options") from None
    people = participants.load_pool(pool, spec) if pool is not None else None
    if pool is not None and people is not None:
        _print_warnings(participants.blank_attributes(pool, people, spec))
    plan = planning.plan_power(spec, target, count, people, person_icc)
    if json_out:
        console.print_json(plan.model_dump_json())
        return
    _print_plan(plan)


def _print_plan(plan) -> None:
    console.print(
        f"broken {plan.reference:.3g} (out-group) vs {plan.other:.3g} (in-group), Cohen's h {plan.h:.3f}; "
        f"alpha {plan.alpha:g}, power {plan.power:g}, icc {plan.icc:g}, person icc {plan.person_icc:g}; "
        f"{plan.dialogues} dialogues planned, {plan.targeted:.0f} of them group-targeted",
        highlight=False,
    )
    table = Table(title="Group-targeted dialogues per test and scope", title_justify="left")
    for header in ("test", "scope", "planned", "needed", "power", "deff in/out", "note"):
        table.add_column(header, justify="left" if header in ("test", "scope", "note") else "right")
    for row in plan.rows:
        needed = "-" if row.needed is None else f"{row.needed:.0f}"
        deffs = f"{row.design_effect_in:.2f} / {row.design_effect_out:.2f}"
        mark = "" if row.enough else "[yellow]short[/] "
        table.add_row(
            row.test, row.scope, f"{row.planned:.0f}", needed, f"{row.power:.2f}", deffs, mark + row.note
        )
    console.print(table)
    if plan.pool:
        pool = Table(title="Pool: people who may take each side", title_justify="left")
        columns = list(next(iter(plan.pool.values())))
        pool.add_column("scope")
        for column in columns:
            pool.add_column(column, justify="right")
        for scope, counts in plan.pool.items():
            pool.add_row(scope, *(str(counts[c]) for c in columns))
        console.print(pool)


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


def _print_table(spec: spec_module.CampaignSpec, table: design_module.DesignTable) -> None:
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
    pairs = spec.demographics.pairs()
    for rule_id, by_pair in table.attribute_pairs.items():
        for pair, counts in by_pair.items():
            a, b = pair.split(" x ")
            left, right = pairs[(a, b)]  # the values the spec crosses (a cell it does not draw shows 0)
            grid = {
                (f"{a}={u}", f"{b}={v}"): counts.get(f"{a}={u} x {b}={v}", 0) for u in left for v in right
            }
            title = f"Rule {rule_id}: {pair}"
            console.print(_grid(title, [f"{a}={u}" for u in left], [f"{b}={v}" for v in right], grid))


participants_app = typer.Typer(help="Import and list a campaign's participant pool.", no_args_is_help=True)
app.add_typer(participants_app, name="participants")


@app.command()
def init(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Campaign spec YAML."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of in-group balance and ablation draws."),
) -> None:
    """Create a campaign in the database (ASSAY_DB_URL, else SQLite under ASSAY_HOME) from its spec.

    Example: assay star init examples/star-campaign.yaml
    """
    spec = spec_module.load_spec(spec_path)
    with engine.open_store().begin() as session:
        assign_module.create_campaign(session, spec, seed=seed)
    console.print(f"campaign {spec.name} created", highlight=False)
    _print_warnings(planning.plan_power(spec).warnings())


@participants_app.command("import")
def participants_import(
    campaign: str = typer.Argument(..., help="Campaign name."),
    pool: Path = typer.Argument(..., help="Pool CSV or YAML: id, name, roles, expertise, attributes, caps."),
) -> None:
    """Import (or update) participants; every bad row is reported as file:line, field and value.

    Example: assay star participants import demo-campaign pool.csv
    """
    with engine.open_store().begin() as session:
        summary = participants.import_pool(session, assign_module.get_campaign(session, campaign), pool)
    console.print(f"{summary.added} added, {summary.updated} updated", highlight=False)
    _print_warnings(summary.warnings)


@participants_app.command("list")
def participants_list(
    campaign: str = typer.Argument(..., help="Campaign name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON: one object per person."),
) -> None:
    """Show the campaign's pool as stored: id, name, roles, expertise, each attribute, daily cap, opt-out.

    Example: assay star participants list demo-campaign
    """
    with engine.open_store()() as session:
        found = assign_module.get_campaign(session, campaign)
        people = [person.record() for person in participants.pool_of(session, found)]
        attributes = list(assign_module.campaign_spec(found).demographics.attributes)
    if json_out:
        console.print_json(json.dumps(people))
        return
    table = Table(title=f"{campaign}: {len(people)} participant(s)", title_justify="left")
    for header in ("id", "name", "roles", "expertise", *attributes, "daily cap", "opted out"):
        table.add_column(header, justify="right" if header == "daily cap" else "left")
    for row in people:
        declared = ["; ".join(row["demographics"].get(attr, [])) for attr in attributes]
        table.add_row(
            row["id"],
            row["name"],
            "; ".join(row["roles"]),
            "; ".join(row["expertise"]),
            *declared,
            str(row["daily_cap"]),
            "yes" if row["opted_out"] else "",
        )
    console.print(table)


@app.command()
def assign(
    campaign: str = typer.Argument(..., help="Campaign name."),
    instructions: Path = typer.Option(..., "--instructions", "-i", help="JSONL from 'assay star design'."),
) -> None:
    """Open one red-team task per instruction (in-group/out-group balanced per group); report shortfalls.

    Example: assay star assign demo-campaign --instructions instructions.jsonl
    """
    rows = design_module.read_instructions(instructions)
    with engine.open_store().begin() as session:
        found = assign_module.get_campaign(session, campaign)
        added = assign_module.add_instructions(session, found, rows)
        missing = assign_module.shortfalls(session, found)
    console.print(f"{added} red-team tasks opened", highlight=False)
    _print_shortfalls(missing)


def _print_shortfalls(missing: list) -> None:
    for row in missing:
        errors.print(
            f"[yellow]shortfall:[/] {row.tasks} {row.kind} task(s) for {row.group_label or '(no group)'} "
            f"({row.requirement}): nobody in the pool may take them",
            highlight=False,
        )


@app.command()
def status(
    campaign: str = typer.Argument(..., help="Campaign name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    bootstrap: int = typer.Option(1000, "--bootstrap", min=0, max=100_000, help="Resamples for alpha's CI."),
) -> None:
    """Tasks by kind and status, dialogues and annotations (human and machine apart), agreement so far,
    arbitration rate and shortfalls: the same figures as the web's campaign page.

    Example: assay star status demo-campaign --json
    """
    with engine.open_store()() as session:
        report = status_module.campaign_status(
            session, assign_module.get_campaign(session, campaign), n_boot=bootstrap
        )
    if json_out:
        console.print_json(report.model_dump_json())
        return
    for kind, counts in report.tasks.items():
        console.print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), highlight=False)
    rate = report.arbitration.rate
    console.print(
        f"dialogues {report.dialogues} (machine {report.machine_dialogues}), "
        f"annotations {report.annotations} (machine {report.machine_annotations}), "
        f"complete first rounds {report.complete_first_rounds}, "
        f"arbitration rate {'-' if rate is None else f'{rate:.3f}'} "
        f"({report.arbitration.n_sent} sent, {report.arbitration.n_waiting} waiting)",
        highlight=False,
    )
    console.print(f"agreement (ordinal alpha): {_alpha_text(report.agreement)}", highlight=False)
    console.print(
        f"broken / not broken (nominal alpha): {_alpha_text(report.agreement_broken)}", highlight=False
    )
    _print_shortfalls(report.shortfalls)


def _alpha_text(estimate: AlphaEstimate) -> str:
    """Alpha as the campaign dashboard writes it: below its minimum n the pillar's reason ("too few
    dialogues (n = 2, needs >= 10)"), never a number with a degenerate interval; else the number, its 95%
    interval where there is one, and the dialogues it rests on."""
    if estimate.alpha is None:
        return estimate.reason or "-"
    interval = "" if estimate.low is None else f" (95% CI {estimate.low:.3f} to {estimate.high:.3f})"
    note = f" ({estimate.reason})" if estimate.reason else ""
    return f"{estimate.alpha:.3f}{interval}, n = {estimate.n_units} dialogues{note}"


@app.command()
def sweep() -> None:
    """Once, what a running web server does every few seconds: release expired claims of every campaign
    and the claims of a stopped `assay star simulate`, and re-check shortfalls (tasks nobody may take are
    marked waiting). Safe to run at any time.

    Example: assay star sweep
    """
    done = workflow.sweep(engine.open_store(), store_models.utcnow())
    console.print(
        f"{done.released} claim(s) released, {done.waiting} task(s) waiting for a match", highlight=False
    )


@app.command()
def simulate(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Campaign spec YAML."),
    target: str = typer.Option(..., "--target", help="Target model spec, e.g. hf:PATH or openai:URL."),
    red_teamer: str | None = typer.Option(None, "--red-teamer", help="Red-teamer model (default: target)."),
    annotator: str | None = typer.Option(None, "--annotator", help="Annotator model (default: red teamer)."),
    count: int = typer.Option(10, "--count", "-n", min=1, help="Dialogues to rehearse."),
    turns: int = typer.Option(2, "--turns", min=1, max=20, help="Red-teamer messages per dialogue."),
    seed: int = typer.Option(0, "--seed", min=0, help="Design seed."),
    seeds_from: str | None = typer.Option(
        None, "--seed-topics", help="harmbench or donotanswer: each task a prompt of its own rule."
    ),
    seed_embedder: str = typer.Option(
        "minilm",
        "--seed-embedder",
        help="How --seed-topics matches prompts to rules: minilm, hashing or module:attribute.",
    ),
    max_new_tokens: int = typer.Option(96, "--max-new-tokens", min=1, max=4096, help="Per reply."),
    ratings: str = typer.Option(
        "text",
        "--ratings",
        help="text (parse 'Rating: N') or likelihood (the annotator model's most likely point; hf: only).",
    ),
    name: str | None = typer.Option(None, "--campaign", help="Campaign name (default: SPEC name-simulated)."),
    expert_share: float = typer.Option(
        0.25,
        "--expert-share",
        min=0.0,
        max=1.0,
        help="Share of personas holding each expertise a rule needs.",
    ),
    other_rules_rate: float = typer.Option(
        0.2,
        "--other-rules-rate",
        min=0.0,
        max=1.0,
        help="Share of dialogues marked as breaking another rule.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Rehearse a campaign without people: LLM red teamer, target and annotators, all marked machine-made.
    Run again with the same settings, it resumes where a stopped run left off.

    Example: assay star simulate examples/star-campaign.yaml -n 4 --target hf:SMOLLM2.gguf
    """
    spec = spec_module.load_spec(spec_path)
    if seeds_from is not None:
        seeds_module.check_source(seeds_from)
    target_model = models.load_model(target)
    red = models.load_model(red_teamer) if red_teamer else target_model
    judge = models.load_model(annotator) if annotator else red
    if ratings not in ("text", "likelihood"):
        raise UserError(f"--ratings must be text or likelihood, got {ratings!r}")
    if ratings == "likelihood" and not choice.supports_choice(judge):
        raise UserError(
            f"--ratings likelihood needs an hf: annotator model; {judge.model_id} only returns text"
        )
    agents = simulate_module.Agents(
        target_model, red, judge, model_base.GenerationParams(max_new_tokens=max_new_tokens), ratings
    )
    progress = progress_bar()
    with progress:
        task = progress.add_task("rehearsing", total=None)

        def on_phase(kind: str, tasks: int) -> None:
            progress.update(task, description=f"{kind}: {tasks} task(s)")

        pool = simulate_module.PoolOptions(expert_share, other_rules_rate)
        summary = simulate_module.simulate(
            engine.open_store(),
            spec,
            agents,
            count,
            seed,
            turns,
            seeds_from,
            name,
            on_phase=on_phase,
            pool=pool,
            seed_embedder=embed_module.make_embedder(seed_embedder) if seeds_from else None,
        )
    if json_out:
        console.print_json(json.dumps(summary.__dict__))
        return
    resumed = f" (resumed: {summary.done_before} dialogues were done before)" if summary.resumed else ""
    console.print(
        f"campaign {summary.campaign}{resumed}: {summary.dialogues} dialogues, {summary.annotations} "
        f"annotations, {summary.arbitrations} arbitrations, {summary.unparsed_ratings} unparsed ratings "
        "(machine-made)",
        highlight=False,
    )
    if summary.arms:
        arms = ", ".join(f"{arm} {n}" for arm, n in summary.arms.items())
        console.print(f"dialogues per annotation arm: {arms}", highlight=False)
    pre = summary.pre_annotations
    answers = ", ".join(
        f"{what} {pre.get(key, 0)}"
        for what, key in (
            ("assigned rule broken", "broken"),
            ("not broken", "not_broken"),
            ("unsure", "unsure"),
        )
    )
    console.print(
        f"pre-annotations: {answers}; another rule broken {pre.get('other_rules', 0)}", highlight=False
    )
    if summary.experts:
        tags = ", ".join(f"{tag} {n}" for tag, n in summary.experts.items())
        console.print(
            f"expert personas: {tags}; expert-rule annotations {summary.expert_annotations}, "
            f"{summary.expert_annotations_by_experts} by experts",
            highlight=False,
        )
    for line in summary.shortfalls:
        errors.print(f"[yellow]shortfall:[/] {line}", highlight=False)


@app.command("export")
def export_command(
    campaign: str = typer.Argument(..., help="Campaign name."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for instructions, dialogues, annotations."),
    fmt: str = typer.Option("jsonl", "--format", help="jsonl or parquet."),
    machine: str = typer.Option("exclude", "--machine", help="exclude, include or only machine-made rows."),
) -> None:
    """Export a campaign in the documented schema (docs/star.md).

    Example: assay star export demo-campaign --out export/ --format parquet
    """
    if machine not in ("exclude", "include", "only"):
        raise UserError(f"--machine must be exclude, include or only, got {machine!r}")
    with engine.open_store()() as session:
        counts = exchange.export_campaign(
            session, assign_module.get_campaign(session, campaign), out, fmt, machine
        )  # type: ignore[arg-type]
    console.print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" written to {out}", highlight=False)


@app.command("import")
def import_command(
    source: Path = typer.Argument(..., help="External dialogues, e.g. HH-RLHF harmless-base-test.jsonl.gz."),
    out: Path = typer.Option(..., "--out", "-o", help="Dialogues JSONL in the export schema."),
    fmt: str = typer.Option("hh-rlhf", "--format", help="hh-rlhf, or lines (one prompt per line)."),
    side: str = typer.Option("rejected", "--side", help="HH-RLHF transcript: chosen or rejected."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N rows."),
) -> None:
    """Convert external red-team dialogues into the campaign dialogue schema, for comparison in the analysis.

    Example: assay star import ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz --out hh.jsonl
    """
    if fmt not in ("hh-rlhf", "lines"):
        raise UserError(f"unknown import format {fmt!r}; supported: hh-rlhf, lines")
    if side not in ("chosen", "rejected"):
        raise UserError(f"--side must be chosen or rejected, got {side!r}")
    rows = (
        exchange.import_hh_rlhf(source, side, limit)
        if fmt == "hh-rlhf"
        else exchange.import_lines(source, limit=limit)
    )
    exchange.write_table(rows, out, "jsonl")
    console.print(f"{len(rows)} dialogues written to {out}", highlight=False)


@app.command()
def agreement(
    ratings: Path = typer.Argument(..., help="CSV: one row per unit, one column per coder, blank = missing."),
    level: str = typer.Option(..., "--level", help="nominal, ordinal, interval or ratio."),
    n_boot: int = typer.Option(
        1000, "--bootstrap", min=0, max=100_000, help="Bootstrap replicates (0: none)."
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Bootstrap seed."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Krippendorff's alpha (with a 95% bootstrap interval) and pairwise percent agreement for any table.

    Example: assay star agreement ratings.csv --level ordinal --json
    """
    if level not in ("nominal", "ordinal", "interval", "ratio"):
        raise UserError(f"--level must be nominal, ordinal, interval or ratio, got {level!r}")
    units, coders, data = ratings_module.read_rating_table(ratings)
    try:
        alpha = agreement_module.krippendorff_alpha(data, level)  # type: ignore[arg-type]
        interval = (
            agreement_module.bootstrap_alpha_ci(data, level, n_boot=n_boot, seed=seed) if n_boot else None
        )  # type: ignore[arg-type]
        agreement_share = agreement_module.percent_agreement(data)
    except ValueError as exc:
        raise UserError(f"{ratings}: {exc}") from None
    pairable = int(((~np.isnan(data)).sum(axis=0) >= 2).sum())
    record = {
        "level": level,
        "alpha": alpha,
        "units": len(units),
        "pairable_units": pairable,
        "coders": len(coders),
        "ci95": [interval.low, interval.high] if interval else None,
        "bootstrap": interval.n_boot if interval else 0,
        "percent_agreement": agreement_share,
    }
    if json_out:
        console.print_json(json.dumps(record))
        return
    ci = (
        f" (95% bootstrap interval {interval.low:.3f} to {interval.high:.3f}, {interval.n_boot} replicates)"
        if interval
        else ""
    )
    console.print(
        f"Krippendorff's alpha ({level}) = {alpha:.4f}{ci}; {pairable} pairable units of {len(units)}, "
        f"{len(coders)} coders; pairwise percent agreement {agreement_share:.3f}",
        highlight=False,
    )


def _report_inputs(
    campaign: str | None, export: Path | None, spec_path: Path | None, machine: str
) -> tuple[spec_module.CampaignSpec, dict]:
    """The spec and export tables, from the database (CAMPAIGN) or an export folder (--export)."""
    import pandas as pd

    if (campaign is None) == (export is None):
        raise UserError("give either a CAMPAIGN name (from the database) or --export FOLDER, not both")
    given = spec_module.load_spec(spec_path) if spec_path else None
    if export is not None:
        return exchange.read_export(export, given)
    if machine not in ("exclude", "include", "only"):
        raise UserError(f"--machine must be exclude, include or only, got {machine!r}")
    with engine.open_store()() as session:
        found = assign_module.get_campaign(session, campaign)
        tables = exchange.campaign_tables(session, found, machine)  # type: ignore[arg-type]
        spec = given or assign_module.campaign_spec(found)
    return spec, {name: pd.DataFrame(rows) for name, rows in tables.items()}


@app.command()
def report(
    campaign: str | None = typer.Argument(None, help="Campaign name in the database (or use --export)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for report.html, summary.json and tables/."),
    export: Path | None = typer.Option(None, "--export", help="An `assay star export` folder instead."),
    spec_path: Path | None = typer.Option(None, "--spec", help="Campaign spec YAML (default: stored one)."),
    compare: list[Path] = typer.Option(
        [],
        "--compare",
        help="External dialogues (`assay star import`) for the thematic map; repeatable.",
    ),
    machine: str = typer.Option("exclude", "--machine", help="exclude, include or only machine-made rows."),
    embedder_name: str = typer.Option(
        "minilm", "--embedder", help="minilm, hashing, module:attribute, or none to skip the map."
    ),
    clusters: int = typer.Option(20, "--clusters", min=2, max=200, help="Ward clusters on the map."),
    neighbours: int = typer.Option(5, "--neighbours", min=2, max=200, help="UMAP neighbours."),
    per_source: int | None = typer.Option(
        None, "--per-source", min=3, help="Dialogues per data set (default: the smallest set's size)."
    ),
    cache: Path | None = typer.Option(None, "--cache", help="Embedding cache (default ASSAY_HOME/cache)."),
    n_boot: int = typer.Option(
        1000, "--bootstrap", min=0, max=100_000, help="Bootstrap replicates for alpha's CI (0: no interval)."
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Bootstrap, sampling and UMAP seed."),
    min_n: int = typer.Option(
        5,  # analysis.inference.DEFAULT_MIN_N, written out so `assay --help` does not import statsmodels
        "--min-n",
        min=1,
        max=100_000,
        help="Fewest dialogues a cell needs before it is tested.",
    ),
    paper_tests: bool = typer.Option(
        False, "--paper-tests", help="Add the seed paper's t-tests and ANOVAs (naive) for comparison."
    ),
    theme_labels_path: Path | None = typer.Option(
        None,
        "--theme-labels",
        help="Theme labels, CSV or JSON (the web page's download, or a report's tables/themes_labels.csv); "
        "default: those agreed on the web for CAMPAIGN.",
    ),
) -> None:
    """Every analysis of a campaign: one self-contained HTML page, CSV tables and a JSON summary.

    Example: assay star report demo-campaign --machine include --compare hh.jsonl --out report/
    """
    from assay.star.analysis.report import build_report, theme_options, write_report

    spec, frames = _report_inputs(campaign, export, spec_path, machine)
    others = [exchange.read_table(path) for path in compare]
    themes = theme_options(
        embedder_name, cache, n_clusters=clusters, n_neighbors=neighbours, per_source=per_source, seed=seed
    )
    if themes is not None:
        themes.labels = _theme_labels(theme_labels_path, campaign)
    with progress_bar() as progress:
        progress.add_task("analysing", total=None)
        result = build_report(
            spec, frames, others, themes, n_boot=n_boot, seed=seed, min_n=min_n, paper_tests=paper_tests
        )
    files = write_report(result, spec, out)
    summary = result.summary
    ordinal = summary["reliability"]["ordinal"]
    overall = summary["in_group_annotation"][0] if summary["in_group_annotation"] else None
    console.print(
        f"{spec.name}: {summary['n']['dialogues']} dialogues, {summary['n']['annotations']} annotations; "
        f"ordinal alpha {_fmt(ordinal['alpha'])} (n={ordinal['n_units']})"
        + (
            f"; broken in-group {_fmt(overall['in_group']['share'])} (n={overall['in_group']['n']}) vs "
            f"out-group {_fmt(overall['out_group']['share'])} (n={overall['out_group']['n']}), "
            f"p={_fmt(overall['p_value'])} ({overall['reason'] or 'default test'})"
            if overall
            else ""
        ),
        highlight=False,
    )
    console.print(f"{len(files)} files written to {out} (open {out / 'report.html'})", highlight=False)
    unmatched = summary.get("themes", {}).get("labels_unmatched", [])
    if unmatched:
        console.print(
            f"{len(unmatched)} theme label(s) not shown: no cluster of this map shares more than half of "
            "their dialogues (the clustering changed); label the new clusters on the web",
            highlight=False,
        )


def _theme_labels(path: Path | None, campaign: str | None) -> list:
    """Labels from ``--theme-labels``, else those agreed on the web for the campaign (none for --export)."""
    from assay.star import theme_labels

    if path is not None:
        return theme_labels.read_labels(path)
    if campaign is None:
        return []
    with engine.open_store()() as session:
        return theme_labels.agreed_labels(session, assign_module.get_campaign(session, campaign))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
