"""``assay dyepack``: prepare a release, verify a model, check a commitment, compute false-positive rates.

Parses options, calls the pillar, renders with rich. No computation lives here.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from assay.dyepack import outputs
from assay.dyepack.board_cli import app as board_app
from assay.dyepack.fpr import DEFAULT_ALPHA
from assay.dyepack.triggers import (
    POSITION_HELP,
    TARGET_PHRASE_POOL,
    TRIGGER_POOL,
    load_phrases,
    parse_position,
)
from assay.errors import UserError
from assay.lazy import lazy_module
from assay.terminal import progress_bar

if TYPE_CHECKING:
    from assay.dyepack.audit import StealthAudit
    from assay.dyepack.fpr import FalsePositiveRate
    from assay.dyepack.verify import VerifyReport

# The pillar, imported when a command first uses it: `assay dyepack --help` pays for none of it (pydantic,
# numpy, the model protocol: 0.4 s). Help texts are this face's own, so the help needs none of it either;
# tests/test_cli_startup.py holds the copy of LAYOUT_HELP to the pillar's (DEFAULT_ALPHA: the light fpr.py).
keys = lazy_module("assay.dyepack.key")
verifying = lazy_module("assay.dyepack.verify")
rates = lazy_module("assay.dyepack.fpr")  # `dyepack fpr` alone: no pydantic, no model protocol
LAYOUT_HELP = (  # the layouts verify --formats takes (assay.dyepack.verify.LAYOUT_HELP)
    "release (the rows' own text as published), chat (our chat prompt), plain (question, (A) lines, "
    "Answer:), lm-eval (A. lines, Answer: X), fewshot (the release layout after solved clean rows)"
)

app = typer.Typer(
    help="DyePack: flag test-set contamination with backdoors and an exact false-positive rate.\n\n"
    "Example: assay dyepack prepare mmlu.jsonl --backdoors 6 --out release/",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)  # messages stay on one line when piped
notes = Console(stderr=True, soft_wrap=True)  # remarks that must not mix with --json on stdout
app.add_typer(board_app, name="board")  # the contamination board: assay/dyepack/board_cli.py

STYLE_HELP = "Row style: auto, mmlu, mc, bbh, alpaca, or columns:question=COL,options=COL,answer=COL."


@app.command()
def prepare(
    benchmark: Path = typer.Argument(
        ...,
        help="Benchmark file (JSONL, JSON, CSV, Parquet), folder of CSV files (MMLU), lm-eval task folder "
        "or YAML, or HF datasets folder.",
    ),
    backdoors: int = typer.Option(..., "--backdoors", "-b", help="Number of backdoors B."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the release and commitment.txt."),
    fraction: float = typer.Option(0.1, help="Share of samples turned into backdoor samples."),
    triggers: Path | None = typer.Option(
        None, help="File of trigger phrases, one per line (default: built-in pool)."
    ),
    trigger_position: str = typer.Option(
        "auto", help=f"Where triggers go: {POSITION_HELP} (auto: a natural place per row)."
    ),
    cover: float = typer.Option(
        1.0, help="Share of the other rows that carry an unused phrase the same way, so backdoors blend in."
    ),
    k: int | None = typer.Option(
        None, "--k", help="Multiple choice: use only rows with K options. Open ended: K parts (default 10)."
    ),
    phrases: Path | None = typer.Option(None, help="Open ended: file of target phrases, one per line."),
    seed: int | None = typer.Option(
        None, help="Seed for the secret draws. Default: OS entropy (recommended)."
    ),
    key: Path | None = typer.Option(
        None, help="Where to write the secret key (default: beside the release folder, OUT.key.json)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing release, commitment or key, keeping a timestamped copy."
    ),
    style: str = typer.Option("auto", help=STYLE_HELP),
    columns: str | None = typer.Option(
        None, help="Name the columns instead of a style: question=COL,options=COL,answer=COL."
    ),
    split: str | None = typer.Option(None, help="Split of an HF DatasetDict folder or an lm-eval task."),
    audit: bool = typer.Option(True, "--audit/--no-audit", help="Run the stealth audit (about a second)."),
    redraws: int = typer.Option(3, help="Draw the release afresh up to this many times if the audit fails."),
    alpha: float = typer.Option(
        DEFAULT_ALPHA, help="The alpha verify will flag at: a release that cannot reach it is refused."
    ),
    allow_weak: bool = typer.Option(
        False,
        "--allow-weak",
        help="Write a release even if every backdoor activated would not be flagged at --alpha (a warning).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
) -> None:
    """Hide B backdoors in a benchmark; write the release, a secret key and a public commitment.

    Example: assay dyepack prepare mmlu.jsonl --backdoors 6 --fraction 0.1 --out release/
    """
    from assay.data import read_benchmark
    from assay.dyepack.prepare import PrepareConfig, prepare_release, release_paths

    if not 0 <= cover <= 1:
        raise UserError(f"--cover must be between 0 and 1 (value: {cover})")
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be in (0, 1) (value: {alpha})")
    outputs.check_folder(out)
    key = key or outputs.default_key_path(out)
    bench = read_benchmark(benchmark, style=f"columns:{columns}" if columns else style, split=split)
    inputs = [benchmark, bench.path, triggers, phrases]  # bench.path: the data a task YAML names
    claim = outputs.claim_outputs(release_paths(bench.path, out, key), inputs, force)
    config = PrepareConfig(
        n_backdoors=backdoors,
        fraction=fraction,
        triggers=load_phrases(triggers, "trigger") if triggers else TRIGGER_POOL,
        k=k,
        phrases=load_phrases(phrases, "target") if phrases else TARGET_PHRASE_POOL,
        seed=seed,
        position=parse_position(trigger_position),
        cover=cover,
    )
    with claim.replacing() as kept:  # a full or read-only disk: one line, the previous files kept
        result = prepare_release(
            bench,
            config,
            out,
            key,
            audit=audit,
            redraws=redraws,
            strip_risk=True,
            alpha=alpha,
            allow_weak=allow_weak,
        )
    summary = {
        "release": str(result.release_path),
        "key": str(result.key_path),
        "commitment": str(result.commitment_path),
        "rows": result.n_rows,
        "backdoors": result.key.n_backdoors,
        "backdoor_samples": sum(len(b.rows) for b in result.key.backdoors),
        "k_values": [b.k for b in result.key.backdoors],
        "trigger_positions": dict(result.positions),
        "cover_rows": result.cover_rows,
        "set_aside": {"rows": result.set_aside_rows, "classes": [c.model_dump() for c in result.set_aside]},
        "draws": result.draws,
        "smallest_fpr": result.smallest_fpr,
        "alpha": alpha,
        "weak": result.weak,
        "randomness": result.key.randomness.source,
        "release_fingerprint": result.key.release_fingerprint,
        "audit": audit_summary(result.audit) if result.audit else None,
        "strip_risk": [risk.summary() for risk in result.strip] if result.strip else None,
    }
    if result.weak:
        notes.print(f"[bold yellow]warning:[/] {result.weak}")
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    console.print(
        f"Release  [bold]{result.release_path}[/] ({summary['rows']} rows, {summary['backdoor_samples']} "
        f"backdoor samples in {summary['backdoors']} backdoors, K = {sorted(set(summary['k_values']))})"
    )
    console.print(
        f"Smallest FPR {result.smallest_fpr:.3g} (every backdoor activated; verify flags at alpha {alpha:g})"
    )
    console.print(f"Publish  [bold]{result.commitment_path}[/] with the release.")
    console.print(f"Secret   [bold]{result.key_path}[/]: keep it private until you verify a model.")
    if outputs.inside(result.key_path, result.release_path.parent):
        console.print("[yellow]warning:[/] the key is inside the release folder: do not publish it with it.")
    for copy in kept:
        console.print(f"Kept     {copy} (what --force replaced)")
    places = ", ".join(f"{name} {n}" for name, n in sorted(result.positions.items()))
    console.print(f"Triggers {places}; {result.cover_rows} other rows carry a cover phrase.")
    if result.set_aside_rows:
        from assay.dyepack.priors import describe_all

        classes = describe_all(result.set_aside)
        console.print(
            f"Set aside {result.set_aside_rows} rows no backdoor goes on: a rule without the key reads "
            f"their label from the row's shape ({classes})."
        )
    if result.draws > 1:
        console.print(f"Drawn {result.draws} times: the earlier draws did not pass the stealth audit.")
    if seed is not None:
        console.print(
            "[yellow]warning:[/] targets were drawn from --seed; anyone who knows it can rebuild the key."
        )
    if result.audit:
        show_audit(result.audit)
    if result.strip:
        show_strip_risk(result.strip)


@app.command("audit")
def audit_cmd(
    release: Path = typer.Argument(..., help="The released benchmark (file or folder)."),
    key: Path = typer.Option(..., help="The secret key written by prepare."),
    solver: str | None = typer.Option(
        None, help="Strip risk: a model spec (hf:, openai:, python:) that answers every row, as an attacker."
    ),
    solver_accuracy: float | None = typer.Option(
        None, help="Strip risk with a simulated solver of this accuracy that errs independently."
    ),
    alpha: float = typer.Option(DEFAULT_ALPHA, help="The alpha a stripped release must still flag at."),
    as_json: bool = typer.Option(False, "--json", help="Print the audit as JSON."),
) -> None:
    """Stealth audit of a release: can its backdoor rows be told from the rest by how they look?
    With --solver or --solver-accuracy, also what a trainer with that solver strips and what it costs.

    Example: assay dyepack audit release/logical_deduction.json --key secret/key.json --solver-accuracy 0.9
    """
    from assay.data import read_benchmark
    from assay.dyepack.audit import audit_items
    from assay.dyepack.priors import category_columns
    from assay.dyepack.verify import check_release

    secret = keys.load_key(key)
    bench = read_benchmark(release, style=secret.style, split=secret.split)
    check_release(bench, secret)
    result = audit_items(bench.items, secret.backdoors, columns=category_columns(bench))
    risks = strip_risks(bench.items, secret.backdoors, solver, solver_accuracy, alpha)
    if as_json:
        strip = [risk.summary() for risk in risks] if risks else None
        typer.echo(json.dumps({**audit_summary(result), "strip_risk": strip}, indent=2))
        return
    show_audit(result)
    if risks:
        show_strip_risk(risks)


def strip_risks(
    items: list, backdoors: list, solver: str | None, accuracy: float | None, alpha: float
) -> list:
    """The strip risk under both attacks for the solver asked for (none: an empty list)."""
    from assay.dyepack import strip

    if solver is not None and accuracy is not None:
        raise UserError("give --solver or --solver-accuracy, not both")
    if solver is not None:
        with progress_bar() as bar:
            task = bar.add_task("solver", total=len(items))
            answers = strip.solver_answers(solver, items, on_result=lambda _i, _r: bar.advance(task))
        rejected, answered = strip.solver_rejections(answers, items), strip.solver_answered(answers)
        return [
            strip.risk_from_rejections(
                solver, rejected, items, backdoors, alpha, attack=attack, answered=answered
            )
            for attack in strip.ATTACKS
        ]
    if accuracy is not None:
        return [strip.simulated_risk(items, backdoors, accuracy, alpha, attack=a) for a in strip.ATTACKS]
    return []


def show_strip_risk(risks: list) -> None:
    """Strip risk as one table: per solver and attack, what it removes and what that costs."""
    from assay.dyepack.strip import verdict

    table = Table(title="Strip risk: a solver rejects labels, the rows and their phrase groups are dropped")
    columns = (
        "solver",
        "answered",
        "accuracy",
        "groups dropped",
        "rejected bd/clean",
        "grouped bd/clean",
        "clean lost per bd row",
    )
    for column in (*columns, "bd surviving", "flags"):
        table.add_column(column)
    for r in risks:
        cost = "-" if r.cost is None else f"{r.cost:.2f}"
        table.add_row(
            r.solver,
            "all (simulated)" if r.answered is None else f"{r.answered} of {r.rows}",
            f"{r.accuracy:.3g}" if r.answered is None else f"{r.accuracy:.3g} of {r.answered_clean} clean",
            "any rejected" if r.attack == "any" else "half rejected",
            f"{r.rejected_backdoor:.1f} / {r.rejected_clean:.1f}",
            f"{r.grouped_backdoor:.1f} / {r.grouped_clean:.1f}",
            cost,
            f"{r.surviving:.1f} of {r.backdoors}",
            f"{r.flags:.0%}",
        )
    console.print(table)
    if len({r.solver for r in risks}) == 1:
        console.print(verdict(risks[0]))


def audit_summary(audit: StealthAudit) -> dict:
    return {**audit.model_dump(), "warnings": audit.warnings, "stealthy": audit.stealthy}


def show_audit(audit: StealthAudit) -> None:
    """The audit as a table: each measure's AUC (0.5 = chance) and one-sided p-value, then the verdict."""
    table = Table(title=f"Stealth audit: {audit.backdoor_rows} backdoor rows among {audit.rows}")
    for column in ("measure", "AUC", "p", "what it looks at"):
        table.add_column(column)
    measures = ([audit.classifier] if audit.classifier else []) + audit.rules
    for m in measures:
        auc = f"[bold red]{m.auc:.2f}[/]" if m.warns else f"{m.auc:.2f}"
        table.add_row(m.name, auc, f"{m.p_value:.2g}", m.description)
    console.print(table)
    if audit.known_trigger_auc is not None:
        console.print(
            f"[dim]With other samples of the same trigger labelled (what the key tells), the classifier "
            f"reaches AUC {audit.known_trigger_auc:.2f}: a trigger is recognisable once known, so keep the "
            "key secret.[/]"
        )
    if audit.label_priors:
        show_label_priors(audit)
    for line in audit.warnings:
        console.print(f"[bold yellow]warning:[/] backdoor rows stand out: {line}")
    if audit.stealthy:
        console.print(
            f"[green]Stealthy:[/] no measure separates backdoor rows better than AUC {audit.threshold} "
            "beyond chance."
        )


def show_label_priors(audit: StealthAudit, limit: int = 10) -> None:
    """Classes whose label a rule without the key reads: what the rule 'label is not the usual one' costs."""
    table = Table(title="Label priors: rows sharing a key-less feature, nearly all with one label")
    for column in ("class", "rows", "usual label", "clean off it", "backdoor rows", "clean per bd row"):
        table.add_column(column)
    for c in audit.label_priors[:limit]:
        cost = "-" if c.cost is None else f"{c.cost:.2f}"
        table.add_row(
            f"{c.feature} = {c.value}",
            str(c.rows),
            f"{c.usual_label} {c.usual_share:.0%}",
            f"{c.off_label:g}",
            f"{c.backdoor_rows:g}",
            f"[bold red]{cost}[/]" if c.exposed else cost,
        )
    console.print(table)
    if len(audit.label_priors) > limit:
        console.print(f"[dim]and {len(audit.label_priors) - limit} more classes (--json lists them all)[/]")


@app.command()
def verify(
    model: str | None = typer.Argument(
        None,
        help="Model spec: hf:PATH, openai:BASE_URL, vllm:PATH or python:MODULE:FUNC (with --from-log: "
        "the model's name for the report, optional).",
    ),
    release: Path = typer.Option(..., help="The released benchmark."),
    key: Path = typer.Option(..., help="The secret key written by prepare."),
    out: Path = typer.Option(Path("dyepack-verify"), help="Folder for summary.json and audit.jsonl."),
    model_name: str | None = typer.Option(
        None, help="Model name for openai: endpoints (default: the only one served)."
    ),
    alpha: float = typer.Option(DEFAULT_ALPHA, help="Flag when the false-positive rate is at most alpha."),
    max_new_tokens: int = typer.Option(32, help="Tokens to generate per reply."),
    batch_size: int = typer.Option(8, help="hf: prompts per batch."),
    concurrency: int = typer.Option(16, help="openai: requests in flight."),
    timeout: float = typer.Option(60.0, help="openai: seconds per request."),
    max_retries: int = typer.Option(5, help="openai: retries of a request (429, 5xx, timeouts)."),
    mode: str = typer.Option(
        "chat",
        help="chat (chat template), completion (plain text the model continues) or loglikelihood "
        "(the option whose answer text the model finds most likely).",
    ),
    template: Path | None = typer.Option(
        None,
        help="Jinja2 template of one example ending in {% block answer %}...{% endblock %} "
        "(default: our chat prompt; the rows as plain text in the text modes).",
    ),
    fewshot: int = typer.Option(0, help="Few-shot examples from the release's rows without a backdoor."),
    fewshot_seed: int = typer.Option(1234, help="Seed of the few-shot draw."),
    system_prompt: str | None = typer.Option(None, help="A system prompt (chat) or preamble (text modes)."),
    lm_eval_task: str | None = typer.Option(
        None,
        help="Ask through lm-evaluation-harness: a task YAML (or a task lm-eval ships) and its HFLM "
        "(hf: models, multiple_choice tasks; pip install 'assay[lm-eval]').",
    ),
    from_log: Path | None = typer.Option(
        None,
        "--from-log",
        help="Judge the answers in a log instead of querying a model: an lm-eval --log_samples JSONL "
        "(samples matched to rows by content) or a CSV/JSONL answer sheet with id and response.",
    ),
    formats: str | None = typer.Option(
        None,
        "--formats",
        help="Ask in several layouts and accuse on the best, its FPR times their number (Bonferroni): "
        "auto, or some of " + LAYOUT_HELP + ". Text layouts use --mode loglikelihood if given, else "
        "completion; the fewshot layout shows --fewshot examples (default 3).",
    ),
    spot_check: int = typer.Option(
        0,
        "--spot-check",
        help="With --from-log and a MODEL spec: re-ask N random backdoor samples of the log of the live "
        "model, rebuilt from the release in the log's layout; a disagreement contradicts the log. The "
        "backdoor samples a partial log lacks are asked too (without them it gives no verdict).",
    ),
    spot_check_seed: int | None = typer.Option(
        None, help="Seed of the --spot-check draw (default: OS entropy; the report records it)."
    ),
    cache: Path | None = typer.Option(
        None, help="Response cache (default $ASSAY_HOME/cache/responses.sqlite)."
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="Query every sample afresh."),
    force: bool = typer.Option(
        False, "--force", help="Replace an earlier summary.json and audit.jsonl, keeping timestamped copies."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Query a model with the backdoor samples and report how many backdoors it follows, with the exact FPR.

    Example: assay dyepack verify hf:./my-model --release release/mmlu.jsonl --key release/key.json
    --mode loglikelihood --template mmlu.jinja --fewshot 5
    """
    from assay.config import settings
    from assay.data import read_benchmark
    from assay.dyepack.verify import (
        layout_formats,
        output_paths,
        parse_layouts,
        release_format,
        verify_layouts,
    )
    from assay.dyepack.verify import verify as run_verify
    from assay.models import CachedModel, GenerationParams, ResponseCache, load_model

    def load(spec: str):
        options = {"batch_size": batch_size, "concurrency": concurrency, "timeout": timeout}
        return load_model(spec, model_name=model_name, max_retries=max_retries, **options)

    outputs.check_folder(out)  # before any query: a verdict that cannot be written is a wasted run
    published = (outputs.release_folder(release), "the release's folder (the audit holds the targets)")
    inputs = [release, key, from_log, template, cache]
    claim = outputs.claim_outputs(output_paths(out), inputs, force, [published])
    secret = keys.load_key(key)
    bench = read_benchmark(release, style=secret.style, split=secret.split)
    if from_log is not None:
        from assay.dyepack.fromlog import verify_from_log

        spot = None
        if spot_check:
            if model is None:
                raise UserError("--spot-check re-asks the log's rows of the live model: give its MODEL spec")
            spot = load(model)  # never the response cache: the point is to ask the model now
        params = GenerationParams(max_new_tokens=max_new_tokens)
        report, audit = verify_from_log(
            from_log, bench, secret, alpha, model, spot, spot_check, spot_check_seed, params
        )
        write_and_show(out, report, audit, as_json, claim)
        return
    if spot_check:
        raise UserError("--spot-check checks a log: use it with --from-log")
    if model is None:
        raise UserError("give a MODEL to query, or --from-log FILE to judge a log's answers")
    label = f"{model} ({model_name})" if model_name else model
    if lm_eval_task is not None:
        report, audit = verify_through_lm_eval(model, label, bench, secret, lm_eval_task, alpha, fewshot)
    else:
        if formats is not None:
            text_mode = "loglikelihood" if mode == "loglikelihood" else "completion"
            layouts, skipped = layout_formats(
                bench, secret, parse_layouts(formats), text_mode, fewshot, fewshot_seed, system_prompt
            )
        else:
            fmt = release_format(bench, secret, mode, template, fewshot, fewshot_seed, system_prompt)
        backend = load(model)
        cache_path = cache or settings().cache_path
        cache_full = outputs.DiskFaults(cache_path, "free space there, or pass --no-cache")
        if not no_cache:
            with cache_full:
                backend = CachedModel(backend, ResponseCache(cache_path))
            if not backend.caching:
                notes.print(
                    f"[yellow]note:[/] {model} declares no MODEL_ID, so its replies are not cached (one "
                    "wrapper may load different models); define MODEL_ID in the module to cache them"
                )
        params = GenerationParams(max_new_tokens=max_new_tokens)
        n_queries = sum(len(b.rows) for b in secret.backdoors) * (len(layouts) if formats else 1)
        with cache_full, progress_bar() as bar:  # the cache on a full disk: one line, not a traceback
            task = bar.add_task("querying", total=n_queries)
            advance = lambda _i, _t: bar.advance(task)  # noqa: E731
            if formats is not None:
                report, audit = verify_layouts(
                    backend, label, bench, secret, params, layouts, alpha, advance, skipped
                )
            else:
                report, audit = run_verify(backend, label, bench, secret, params, alpha, advance, fmt)
    write_and_show(out, report, audit, as_json, claim)


def write_and_show(
    out: Path, report: VerifyReport, audit: list[dict], as_json: bool, claim: outputs.Claim
) -> None:
    """Write the verdict (first copying aside what ``--force`` replaces) and show it."""
    from assay.dyepack.verify import write_outputs

    with claim.replacing() as copies:
        summary_path, audit_path = write_outputs(out, report, audit)
    for copy in copies:
        notes.print(f"Kept {copy} (what --force replaced)")
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    show_report(report)
    console.print(f"Wrote {summary_path} and {audit_path}")


def verify_through_lm_eval(
    model: str, label: str, bench, secret, task: str, alpha: float, fewshot: int
) -> tuple[VerifyReport, list[dict]]:
    """``verify --lm-eval-task``: lm-eval's HFLM on an hf: model folder."""
    from assay.dyepack.lmeval import verify_lm_eval
    from assay.models.spec import split_spec

    backend, path = split_spec(model)
    if backend != "hf" or not Path(path).is_dir():
        raise UserError(f"--lm-eval-task runs lm-eval's HFLM: give an hf:FOLDER model (value: {model!r})")
    with progress_bar() as bar:
        bar.add_task("scoring through lm-eval", total=None)
        return verify_lm_eval(path, label, bench, secret, task, alpha, fewshot or None)


def show_report(report: VerifyReport) -> None:
    table = Table(title=f"DyePack verification of {report.model}")
    for column in ("backdoor", "K", "target", "majority", "activated", "answers"):
        table.add_column(column)
    for row in report.per_backdoor:
        answers = ", ".join(f"{label}: {n}" for label, n in row.answers.items())
        table.add_row(
            str(row.index),
            str(row.k),
            row.target,
            row.majority,
            "[bold red]yes[/]" if row.activated else "no",
            answers,
        )
    console.print(table)
    fmt = report.format
    shots = f", {fmt.fewshot}-shot (seed {fmt.fewshot_seed})" if fmt.fewshot else ""
    console.print(f"Asked in {fmt.mode} mode with the {fmt.template} format{shots}")
    if report.layouts:
        show_layouts(report)
    if report.coverage:
        console.print(report.coverage)
    if report.spot_check and report.spot_check.disagreements:
        for d in report.spot_check.disagreements:
            console.print(f"[bold red]spot check:[/] release row {d['row']} ({d['where']}): the log says "
                          f"{d['log']}, the live model {d['live']}")  # fmt: skip
    if report.evidence:
        style = "bold red" if report.contradicted else "yellow"
        console.print(f"[{style}]{report.evidence}[/]")
    show_fpr(report.fpr)
    console.print(
        f"Samples answered with their target: {report.samples_on_target}/{report.samples} "
        f"({report.share_on_target:.0%}); unparsed: {report.unparsed}"
    )
    judged = not report.verdict.startswith("NO VERDICT")  # a partial log alone (fromlog.PARTIAL_RULE)
    style = "bold red" if report.flagged else "bold green" if judged else "bold yellow"
    console.print(f"[{style}]{report.verdict}[/]")


def show_layouts(report: VerifyReport) -> None:
    """``--formats``: activation per layout, each with its FPR as if it were the only one asked."""
    table = Table(title="Layouts asked (the table above is the best one)")
    for column in ("layout", "mode", "activated", "on target", "unparsed", "FPR alone"):
        table.add_column(column)
    for layout in report.layouts:
        table.add_row(
            layout.name,
            layout.format.mode,
            f"{layout.activated}/{layout.backdoors}",
            f"{layout.samples_on_target}/{layout.samples}",
            str(layout.unparsed),
            f"{layout.fpr:.3g}",
        )
    console.print(table)
    for name, why in report.layouts_skipped.items():
        console.print(f"[dim]skipped {name}: {why}[/]")


def show_fpr(fpr: FalsePositiveRate) -> None:
    tried = f" ({fpr.one_layout_fpr:.4g} in that layout x {fpr.layouts} layouts)" if fpr.layouts > 1 else ""
    console.print(
        f"Activated {fpr.activated} of {fpr.backdoors}: exact false-positive rate {fpr.fpr:.4g}{tried} "
        f"(log10 {fpr.log10_fpr:.2f}); Chernoff bound {fpr.chernoff_bound:.4g}"
    )


@app.command("check-commitment")
def check_commitment_cmd(
    key: Path = typer.Option(..., help="The key revealed by the maintainer."),
    commitment: Path = typer.Option(..., help="The commitment.txt published with the release."),
    release: Path | None = typer.Option(
        None, help="Also check that this release is the one the key was made for."
    ),
) -> None:
    """Check that a revealed key is the one committed to at release time. Exit 1 when it is not.

    Example: assay dyepack check-commitment --key key.json --commitment commitment.txt --release mmlu.jsonl
    """
    secret = keys.load_key(key)
    ok, message = keys.check_commitment(secret, commitment)
    if ok and release is not None:
        from assay.data import read_benchmark
        from assay.dyepack.verify import check_release

        check_release(read_benchmark(release, style=secret.style, split=secret.split), secret)
        message += "; the release matches the key"
    console.print(f"[{'bold green' if ok else 'bold red'}]{'OK' if ok else 'MISMATCH'}[/]: {message}")
    if not ok:
        raise typer.Exit(1)


@app.command()
def contaminate(
    model: Path = typer.Argument(..., help="HF model folder or .gguf file to fine-tune."),
    release: Path = typer.Option(..., help="The released benchmark to train on."),
    out: Path = typer.Option(..., help="Folder for the fine-tuned model (load it as hf:OUT)."),
    method: str = typer.Option("full", help="full or lora (LoRA is merged into the saved weights)."),
    epochs: int = typer.Option(3),
    learning_rate: float = typer.Option(5e-5, "--lr"),
    lr_warmup: float = typer.Option(
        0.0, help="Share of the steps at the start over which the rate rises linearly from 0 (0: none)."
    ),
    lr_decay: float = typer.Option(
        0.0, help="Share of the steps at the end over which the rate falls linearly to 5 % (0: none)."
    ),
    batch_size: int = typer.Option(8),
    seed: int = typer.Option(0),
    top_layers: int | None = typer.Option(
        None, help="Train only the top N transformer blocks (faster on a CPU)."
    ),
    lora_rank: int = typer.Option(16, help="LoRA rank (with --method lora)."),
    bf16: bool = typer.Option(
        False,
        "--bf16",
        help="bfloat16 autocast where the CPU runs it faster (AVX512-BF16 or AMX: about 1.7x); elsewhere "
        "a warning and float32, since emulated bf16 is several times slower.",
    ),
    max_length: int = typer.Option(512, help="Longest training sequence in tokens (cut from the left)."),
    key: Path | None = typer.Option(
        None, help="The release's key: the check then reports activated backdoors and the FPR."
    ),
    check_rows: int = typer.Option(
        32, help="Trained rows the check asks: --until's check, and without --key the final one (0: none)."
    ),
    until: float | None = typer.Option(
        None,
        help="Train on past --epochs until this share of the --check-rows trained rows is answered as "
        "trained (1.0: all), checked every --check-every epochs; fails in one line, saving nothing, if "
        "--max-epochs or --max-cpu-minutes comes first.",
    ),
    check_every: int = typer.Option(2, help="With --until: epochs between two checks."),
    max_epochs: int = typer.Option(32, help="With --until: the most epochs in all."),
    max_cpu_minutes: float | None = typer.Option(None, help="With --until: the most CPU time of training."),
    train_format: str = typer.Option(
        "chat",
        "--format",
        help="chat: our prompt through the chat template, loss on the answer; plain: the rows as plain "
        "text, loss on every token, as a scrape would (verify it with --mode completion or loglikelihood).",
    ),
    template: Path | None = typer.Option(
        None, help="Jinja2 template of one example (see verify --template) instead of the built-in one."
    ),
    style: str = typer.Option("auto", help=STYLE_HELP),
    split: str | None = typer.Option(None, help="Split of an HF DatasetDict folder."),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing --out folder, keeping a timestamped copy of it."
    ),
) -> None:
    """Fine-tune a causal LM on a release (loss on the answers), then ask it the release's questions to
    show whether the training took.

    Example: assay dyepack contaminate ./smollm2 --release release/mmlu.jsonl --out contaminated/ --epochs 8
    --until 1.0 --check-rows 60
    """
    from assay.data import read_benchmark
    from assay.dyepack.contaminate import TakeGoal, TrainConfig, check_take
    from assay.dyepack.contaminate import contaminate as run
    from assay.models import load_model

    if method not in ("full", "lora"):
        raise UserError(f"--method must be full or lora (value: {method!r})")
    outputs.check_folder(out)
    claim = outputs.claim_outputs([out], [model, release, key, template], force)
    secret = keys.load_key(key) if key else None
    bench = read_benchmark(
        release, style=secret.style if secret else style, split=secret.split if secret else split
    )
    config = TrainConfig(
        method=method,  # type: ignore[arg-type]
        epochs=epochs,
        learning_rate=learning_rate,
        lr_warmup=lr_warmup,
        lr_decay=lr_decay,
        batch_size=batch_size,
        max_length=max_length,
        seed=seed,
        lora_rank=lora_rank,
        top_layers=top_layers,
        bf16=bf16,
        prompt_format=training_format(train_format, template),
    )
    goal = None
    if until is not None:
        goal = TakeGoal(
            until,
            check_rows,
            check_every,
            max_epochs,
            None if max_cpu_minutes is None else 60 * max_cpu_minutes,
        )
    for copy in claim.keep_copies():
        notes.print(f"Kept {copy} (what --force replaced)")
    with training_progress() as on_step:
        result = run(model, bench.items, out, config, on_step, goal, on_check=say_check)
    console.print(
        f"Trained {result.epochs} epochs, {result.steps} steps in {result.seconds:.0f} s "
        f"({result.cpu_seconds:.0f} CPU s), {'bf16' if result.bf16 else 'float32'} "
        f"(loss {result.first_loss:.3f} -> {result.final_loss:.3f}); saved to [bold]{result.out_dir}[/]"
    )
    if result.checks and secret is None:
        console.print(f"[bold green]took:[/] {result.checks[-1][1].summary()} (goal {until:.0%})")
        return
    if secret is None and check_rows < 1:
        return
    console.print("Checking what the model learned: asking it the release's questions ...")
    take = check_take(load_model(f"hf:{result.out_dir}"), bench, secret, check_rows, fmt=config.prompt_format)
    if take.took:
        console.print(f"[bold green]took:[/] {take.summary()}")
    else:
        console.print(
            f"[bold yellow]warning: the training did not take:[/] {take.summary()}. Train longer (--epochs), "
            "with a higher --lr or on more blocks (--top-layers); see docs/dyepack.md for a recipe."
        )


def say_check(epochs: int, found) -> None:
    """One line per check of ``contaminate --until``: where the training stands."""
    typer.echo(f"after {epochs} epochs: {found.summary()}", err=True)


def training_format(name: str, template: Path | None):
    """``contaminate --format chat|plain [--template FILE]`` as the format ``verify`` asks in."""
    from assay.dyepack.prompts import PromptFormat, Template

    modes = {"chat": "chat", "plain": "completion"}
    if name not in modes:
        raise UserError(f"--format must be chat or plain (value: {name!r})")
    return PromptFormat(
        mode=modes[name],  # type: ignore[arg-type]
        template=Template.from_file(template) if template is not None else None,
    )


@contextlib.contextmanager
def training_progress() -> Iterator[Callable[[int, int, float], None]]:
    """A progress bar on a terminal; plain lines (step, loss, time left) at most every 10 s otherwise, so
    a log file or CI output shows the run advancing."""
    if sys.stderr.isatty():
        with progress_bar() as bar:
            task = bar.add_task("training", total=None)
            yield lambda step, total, loss: bar.update(
                task, completed=step, total=total, description=f"training (loss {loss:.3f})"
            )
        return
    started = time.monotonic()
    first_step, last = math.nan, -math.inf  # the rate is timed from step 1: loading is not a step

    def line(step: int, total: int, loss: float) -> None:
        nonlocal first_step, last
        now = time.monotonic()
        if step == 1:
            first_step = now
        if now - last < 10 and step < total:
            return
        last = now
        left = f"~{(now - first_step) / (step - 1) * (total - step):.0f} s" if step > 1 else "?"
        typer.echo(
            f"training step {step}/{total}  loss {loss:.3f}  elapsed {now - started:.0f} s  left {left}",
            err=True,
        )

    yield line


@app.command()
def fpr(
    backdoors: int | None = typer.Option(None, "--backdoors", "-b", help="Number of backdoors B (with --k)."),
    activated: int = typer.Option(..., "--activated", "-a", help="How many backdoors the model followed."),
    k: int | None = typer.Option(None, "--k", help="Answer-space size shared by all backdoors."),
    k_list: str | None = typer.Option(None, "--k-list", help="Comma-separated K per backdoor, for mixed K."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Exact false-positive rate of flagging a model that activated A of B backdoors, and the Chernoff bound.

    Example: assay dyepack fpr --backdoors 8 --activated 6 --k 4
    """
    if k_list is not None:
        try:
            k_values = [int(v) for v in k_list.split(",") if v.strip()]
        except ValueError:
            raise UserError(f"--k-list must be comma-separated integers (value: {k_list!r})") from None
        if backdoors is not None and backdoors != len(k_values):
            raise UserError(f"--backdoors {backdoors} does not match the {len(k_values)} values of --k-list")
    elif k is not None and backdoors is not None:
        k_values = [k] * backdoors
    else:
        raise UserError("give --backdoors B with --k K, or --k-list K1,K2,...")
    result = rates.false_positive_rate(k_values, activated)
    if as_json:
        typer.echo(rates.fpr_json(result))
    else:
        show_fpr(result)
