"""``assay leaderboard``: run a TrojAI-style detection leaderboard, and score predictions as NIST does.

Parses options, calls the pillar (rounds, submissions, worker, publish, scoring, views, status), renders with
rich. No computation and no query lives here. The database is ``--db`` / ``ASSAY_DB_URL``, else SQLite under
``ASSAY_HOME``. This is the organiser's tool on the server: what it shows is what an organiser sees
(``assay.leaderboard.views``), unless ``--as-team TEAM`` asks to see it as that team's members do.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from assay.durations import duration
from assay.fileio import atomic_path
from assay.lazy import lazy_module
from assay.store.enums import RoundStatus, SubmissionStatus

# The pillar, imported when a command first uses it: `assay leaderboard --help` pays for none of it.
config = lazy_module("assay.config")
engine = lazy_module("assay.store.engine")
executors = lazy_module("assay.runner.executors")
publish = lazy_module("assay.leaderboard.publish")
rounds = lazy_module("assay.leaderboard.rounds")
scoring = lazy_module("assay.leaderboard.scoring")
status_of = lazy_module("assay.leaderboard.status")
storage = lazy_module("assay.leaderboard.storage")
submissions = lazy_module("assay.leaderboard.submissions")
views = lazy_module("assay.leaderboard.views")
worker_loop = lazy_module("assay.leaderboard.worker")
worker_checks = lazy_module("assay.leaderboard.preflight")
logs = lazy_module("assay.web.logs")
imagebuild = lazy_module("assay.runner.imagebuild")

app = typer.Typer(
    help="Leaderboard: rounds of trojan detection, sandboxed detector runs, NIST-exact scores.\n\n"
    "Example: assay leaderboard round create r1 --dataset round0/splits && assay leaderboard round open r1",
    no_args_is_help=True,
)
round_app = typer.Typer(help="Create, open, close, publish and list rounds.", no_args_is_help=True)
team_app = typer.Typer(help="Add and list teams.", no_args_is_help=True)
app.add_typer(round_app, name="round")
app.add_typer(team_app, name="team")
image_app = typer.Typer(
    help="Build a detector image from an Apptainer definition file.", no_args_is_help=True
)
app.add_typer(image_app, name="image")
# Standings tables are wide; when piped (no terminal to measure) print them at 140 columns, not 80.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, soft_wrap=True)

COLUMNS: tuple[tuple[str, str], ...] = (
    ("n", "n"),
    ("positives", "troj"),
    ("cross_entropy", "CE"),
    ("ce_ci_95", "CE ±95%"),
    ("brier", "Brier"),
    ("roc_auc", "AUC"),
    ("tpr_at_5_fpr", "TPR@5%"),
    ("ece", "ECE"),
)


def _cell(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    return "—" if math.isnan(value) else f"{value:.4f}"


def _table(title: str, first: str, rows: dict[str, scoring.Metrics]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(first)
    for _, header in COLUMNS:
        table.add_column(header, justify="right")
    for label, metrics in rows.items():
        # Text, not markup: a group value, or a cross's "[a=x][b=y]", would otherwise read as rich tags.
        table.add_row(Text(label or "(empty)"), *(_cell(metrics[key]) for key, _ in COLUMNS))
    return table


def _render(report: scoring.ScoreReport) -> None:
    console.print(f"{report.predicted} of {report.models} models predicted", highlight=False)
    if report.missing:
        console.print(
            f"[yellow]{report.flags}[/] {len(report.missing)} model(s) scored as 0.5, first "
            f"{report.missing[0]}",
            highlight=False,
        )
    console.print(_table("overall", "", {"all": report.overall}))
    for factor, groups in report.groups.items():
        console.print(_table(f"by {factor}", factor, groups))


@app.command()
def score(
    predictions: Path = typer.Option(..., "--predictions", "-p", help="CSV: model_name,prediction."),
    truth: Path = typer.Option(
        ..., "--truth", "-t", help="CSV model_name,ground_truth, or a round folder with models/*/."
    ),
    metadata: Path | None = typer.Option(
        None, "--metadata", "-m", help="METADATA.csv for per-factor scores (default: TRUTH/METADATA.csv)."
    ),
    group_by: list[str] | None = typer.Option(
        None,
        "--group-by",
        "-g",
        help="METADATA column to group by, or a cross product 'a*b' (one group per combination, as NIST's "
        "harness); repeat for more (default: factors).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON (NaN as null)."),
) -> None:
    """Score P(trojaned) per model: cross entropy (CE) with CIs, Brier, ROC-AUC, TPR at 5% FPR, ECE.

    Models without a prediction score as 0.5 and are flagged ':Missing Results:', as on NIST's leaderboard.

    Example: assay leaderboard score --predictions preds.csv --truth round0/splits/test -g dataset
    -g 'architecture*trigger_kind'
    """
    report = scoring.score_files(predictions, truth, metadata, group_by or None)
    if json_out:
        console.print_json(report.model_dump_json())
    else:
        _render(report)


@app.callback()
def _database(
    db: str | None = typer.Option(None, "--db", help="Database URL (default: ASSAY_DB_URL or SQLite)."),
) -> None:
    """Leaderboard commands share one database."""
    if db:
        os.environ["ASSAY_DB_URL"] = db


def _sessions():  # type: ignore[no-untyped-def]
    return engine.open_store()


@app.command()
def init() -> None:
    """Create or upgrade the database schema.

    Example: assay leaderboard --db sqlite:///lb.db init
    """
    _sessions()
    console.print(f"database ready: {config.settings().database_url}", highlight=False)


@round_app.command("create")
def round_create(
    name: str = typer.Argument(..., help="Round name."),
    dataset: Path = typer.Option(..., "--dataset", "-d", help="Folder written by 'assay zoo split'."),
    window_hours: float = typer.Option(
        24.0, "--window-hours", min=0, help="Test submissions: one per window."
    ),
    per_model_timeout: float = typer.Option(600.0, "--per-model-timeout", min=1, help="Seconds per model."),
    total_timeout: float = typer.Option(86_400.0, "--total-timeout", min=1, help="Seconds per job."),
    memory_gb: float = typer.Option(4.0, "--memory-gb", min=0.1, help="Memory limit per model run."),
    quota_gb: float = typer.Option(
        2.0, "--quota-gb", min=0.001, help="Unpacked artifact bytes each team may keep in the round."
    ),
    quota_artifacts: int = typer.Option(
        50, "--quota-artifacts", min=1, help="Distinct artifacts each team may keep in the round."
    ),
    keep_practice: int = typer.Option(
        2, "--keep-practice", min=0, help="Latest train/smoke artifacts kept per team; older ones are freed."
    ),
    scratch_gb: float = typer.Option(1.0, "--scratch-gb", min=0.001, help="Scratch space per model run."),
    max_processes: int = typer.Option(256, "--max-processes", min=1, help="Processes per model run."),
    allow_unisolated: bool = typer.Option(
        False,
        "--allow-unisolated",
        help="Run practice (train/smoke) jobs even where no bubblewrap isolation is available; logged on "
        "each such job. Test and holdout jobs never run unisolated.",
    ),
    leak_bits: float = typer.Option(
        8.0,
        "--leak-bits",
        min=0,
        max=64,
        help="Bits about the test labels one test submission may reveal to its team while the round is "
        "open: its score is shown as one of at most 2^bits values (docs/leaderboard.md).",
    ),
    disclosure: str = typer.Option(
        "refined",
        "--disclosure",
        help="How an open round shows test scores: refined (the grid's cell at leak-bits - 1, 0.01 wide on "
        "CE up to 1 at 8 bits, narrowed by the bins the detector's own answers make likely: fewer than "
        "2^leak-bits showings, at most leak-bits bits on average), grid (a fixed grid of 2^leak-bits "
        "cells, 0.005 wide on CE up to 1 at 8 bits), belief (bins weighted by the detector's own answers: "
        "at most leak-bits bits in any outcome to a team that believes them), bins (worst-case bins of >= "
        "2^(n - leak-bits) label vectors; wide intervals) or exact (NIST's board).",
    ),
    max_image_gb: float = typer.Option(
        8.0, "--max-image-gb", min=0.001, help="Largest container image a team may submit."
    ),
    infer_word: bool = typer.Option(
        False,
        "--infer-word/--no-infer-word",
        help="Call detectors as 'entrypoint.py infer --model_filepath ...'; NIST calls them without it.",
    ),
    source_dataset: Path | None = typer.Option(
        None,
        "--source-dataset",
        help="A folder of source data shown read-only to detectors as --source_dataset_dirpath.",
    ),
    metric: str = typer.Option(
        "cross_entropy",
        "--metric",
        help="Ranking metric: cross_entropy (the log score, lower is better), roc_auc (NIST's current "
        "harness, higher is better), brier, ece or tpr_at_5_fpr.",
    ),
    gpus: int = typer.Option(
        0,
        "--gpus",
        min=0,
        help="NVIDIA GPUs each detector run holds (0: a CPU round). Only workers that see that many usable "
        "GPUs take the round's jobs; the sandbox passes the held GPUs and the driver's libraries only.",
    ),
    publish_every: int = typer.Option(
        3600,
        "--publish-every",
        min=1,
        help="The round's clock, in seconds: a sealed (test, holdout) job's result is shown to its team at "
        "the first multiple of it since the epoch after the job finished (3600: every hour on the hour), "
        "never when it happens to finish; until then the team sees only that it was submitted.",
    ),
) -> None:
    """Register a draft round over a split round folder.

    Example: assay leaderboard round create r1 --dataset round0/splits --window-hours 24 --quota-gb 1
    """
    with _sessions().begin() as session:
        created = rounds.create_round(
            session,
            name,
            dataset,
            submission_window_s=round(window_hours * 3600),
            per_model_timeout_s=per_model_timeout,
            total_timeout_s=total_timeout,
            memory_bytes=round(memory_gb * 2**30),
            quota_bytes=round(quota_gb * 2**30),
            quota_artifacts=quota_artifacts,
            keep_practice=keep_practice,
            scratch_bytes=round(scratch_gb * 2**30),
            max_processes=max_processes,
            allow_unisolated=allow_unisolated,
            leak_bits=leak_bits,
            disclosure=disclosure,
            image_bytes=round(max_image_gb * 2**30),
            infer_word=infer_word,
            source_dataset=source_dataset,
            metric=metric,
            gpus=gpus,
            publish_every_s=publish_every,
        )
        splits = ", ".join(f"{s.name} ({len(rounds.split_models(s))})" for s in created.splits)
        warning = rounds.disclosure_warning(created)
    console.print(f"round {name} created (draft); splits: {splits}", highlight=False)
    _warn(warning)


def _warn(warning: str | None) -> None:
    """An organiser's warning on stderr (stdout stays the command's answer)."""
    if warning is not None:
        err_console.print(warning, highlight=False, markup=False)


@round_app.command("set")
def round_set(
    name: str = typer.Argument(..., help="Round name."),
    plateau_delta: float | None = typer.Option(
        None, "--plateau-delta", help="The round has plateaued when its best test score improved by less ..."
    ),
    plateau_days: float | None = typer.Option(None, "--plateau-days", help="... over this many days."),
    gpus: int | None = typer.Option(
        None, "--gpus", min=0, help="NVIDIA GPUs each detector run holds (0: a CPU round)."
    ),
    publish_every: int | None = typer.Option(
        None, "--publish-every", min=1, help="The round's clock: sealed results are shown every this many s."
    ),
) -> None:
    """Change a round's plateau rule, its GPUs or its publication clock; each change is written to the
    audit trail (/admin/audit).

    Example: assay leaderboard round set r1 --plateau-delta 0.005 --plateau-days 7 --publish-every 3600
    """
    with _sessions().begin() as session:
        changes = rounds.set_plateau(session, name, plateau_delta, plateau_days)
        changes += rounds.set_gpus(session, name, gpus) if gpus is not None else []
        changes += rounds.set_publication(session, name, publish_every) if publish_every is not None else []
    console.print(f"round {name}: " + ("; ".join(changes) or "nothing changed"), highlight=False)


@round_app.command("public")
def round_public(
    name: str = typer.Argument(..., help="Round name."),
    public: bool = typer.Option(
        ...,
        "--on/--off",
        help="--on: visitors who are not signed in read the round's standings (test, and holdout once it "
        "closes) on the web, as a member of no team does; --off: signed-in users only.",
    ),
) -> None:
    """Make a round's standings public on the web, or private again; written to the audit trail.

    Example: assay leaderboard round public r1 --on
    """
    with _sessions().begin() as session:
        changed = rounds.set_public(session, name, public)
    state = "public" if public else "private"
    said = f"round {name} is {state}" if changed else f"round {name} is already {state}"
    console.print(said, highlight=False)


@round_app.command("open")
def round_open(name: str = typer.Argument(..., help="Round name.")) -> None:
    """Open a round for submissions.  Example: assay leaderboard round open r1"""
    with _sessions().begin() as session:
        warning = rounds.disclosure_warning(rounds.set_status(session, name, RoundStatus.OPEN))
    console.print(f"round {name} is open", highlight=False)
    _warn(warning)


@round_app.command("close")
def round_close(name: str = typer.Argument(..., help="Round name.")) -> None:
    """Close a round and queue each team's best test submission on holdout (run them with 'worker').

    Example: assay leaderboard round close r1 && assay leaderboard worker --once
    """
    with _sessions().begin() as session:
        queued = submissions.close_round(session, name)
        teams = ", ".join(s.team.name for s in queued) or "none"
    console.print(f"round {name} closed; holdout runs queued for: {teams}", highlight=False)


@round_app.command("list")
def round_list(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List rounds with status and split sizes.  Example: assay leaderboard round list --json"""
    with _sessions()() as session:
        rows = views.round_listing(session)
    if json_out:
        console.print_json(json.dumps([r.model_dump() for r in rows]))
        return
    table = Table("round", "status", "public", "gpus", "splits", "dataset")
    for r in rows:
        splits = " ".join(f"{k}:{v}" for k, v in r.splits.items())
        table.add_row(r.name, r.status, "yes" if r.public else "no", str(r.gpus), splits, r.dataset)
    console.print(table)


@team_app.command("add")
def team_add(
    name: str = typer.Argument(..., help="Team name."),
    contact: str = typer.Option("", "--contact", help="Contact e-mail."),
    kind: str = typer.Option("performer", "--kind", help="performer, baseline or organiser."),
) -> None:
    """Add a team.  Example: assay leaderboard team add alpha --contact alpha@example.org"""
    with _sessions().begin() as session:
        rounds.add_team(session, name, contact, kind)
    console.print(f"team {name} added", highlight=False)


@team_app.command("list")
def team_list(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List teams.  Example: assay leaderboard team list"""
    with _sessions()() as session:
        rows = views.team_listing(session)
    if json_out:
        console.print_json(json.dumps([r.model_dump() for r in rows]))
        return
    table = Table("team", "kind", "contact", "disabled")
    for r in rows:
        table.add_row(r.name, r.kind, r.contact, str(r.disabled))
    console.print(table)


@app.command()
def submit(
    artifact: Path = typer.Argument(
        ..., help="Detector folder or .tar.gz/.zip; or an image: podman/docker save .tar, podman:REF, .sif."
    ),
    team: str = typer.Option(..., "--team", help="Team name."),
    round_name: str = typer.Option(..., "--round", help="Round name."),
    split: str = typer.Option("test", "--split", help="train, smoke or test."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Submit a detector; it is validated now and run by a worker.

    Example: assay leaderboard submit detectors/neural_cleanse --team alpha --round r1 --split test
    """
    with _sessions().begin() as session:
        made = submissions.submit(
            session, config.settings().home / "artifacts", team, round_name, split, artifact
        )
        record = {
            "submission": made.id,
            "status": made.status,
            "sha256": made.artifact_sha256,
            "errors": made.validation_errors.splitlines(),
            "duplicate_of": made.duplicate_of_id,
        }
    if json_out:
        console.print_json(json.dumps(record))
    elif record["status"] == SubmissionStatus.REJECTED:
        console.print(f"submission {record['submission']} rejected:", highlight=False)
        for line in record["errors"]:
            console.print(f"  {line}", highlight=False, markup=False)
    else:
        same = f" (the same files as submission {record['duplicate_of']})" if record["duplicate_of"] else ""
        console.print(f"submission {record['submission']}: {record['status']}{same}", highlight=False)
    if record["status"] == SubmissionStatus.REJECTED:
        raise typer.Exit(2)


@app.command()
def gc(
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; change and delete nothing."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Free disk: release train/smoke artifacts beyond each round's --keep-practice, then delete artifact
    folders no submission holds and temp folders a crashed submit left over an hour ago.

    A folder still held by any team's test or holdout submission, or by a queued or running job, stays.

    Example: assay leaderboard gc --dry-run
    """
    with _sessions().begin() as session:
        report = storage.collect_garbage(session, config.settings().home / "artifacts", dry_run=dry_run)
    if json_out:
        console.print_json(json.dumps(asdict(report)))
        return
    verb, released = ("would remove", "would be released") if dry_run else ("removed", "released")
    for name in report.removed:
        console.print(f"{verb} {name}", highlight=False)
    console.print(
        f"{len(report.released)} practice submission(s) {released}; {verb} {len(report.removed)} "
        f"folder(s), {report.bytes_freed / 2**20:.1f} MiB",
        highlight=False,
    )


@app.command()
def worker(
    once: bool = typer.Option(False, "--once", help="Stop when the queue is empty."),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="Models run at once."),
    executor: str = typer.Option("local", "--executor", help="local or ray."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (with --executor ray)."),
    min_free_mb: int = typer.Option(
        512, "--min-free-mb", min=0, help="Claim nothing while ASSAY_HOME or the temp dir has less free."
    ),
    splits: str | None = typer.Option(
        None,
        "--splits",
        help="Only jobs on these splits, comma-separated: test,holdout for a pool of machines of its own "
        "for sealed jobs, train,smoke for practice, so practice jobs never wait on a sealed one.",
    ),
) -> None:
    """Claim and run queued jobs (each model in its own sandbox), then score them.

    Before each claim the worker checks it can run the job (bubblewrap, podman for images, the split
    folders, the database, free disk); what it cannot run it leaves queued, says why in its log and in
    `assay leaderboard status`, and with --once exits with status 3. SIGTERM or Ctrl-C gives the running
    job back at once (its scored models kept) and exits 0. Logs go to stderr, as JSON lines with
    ASSAY_LOG_FORMAT=json.

    Example: assay leaderboard worker --once --workers 2 --splits test,holdout
    """
    pool = None if splits is None else [name.strip() for name in splits.split(",") if name.strip()]
    if pool is not None:
        worker_loop.on_splits(pool)  # a wrong name is one line, before the executor starts
    settings = config.settings()
    logs.configure(logs.check_format(settings.log_format), settings.log_level)
    runner = executors.make_executor(executor, workers, address)
    sessions = _sessions()
    preflight = worker_checks.Preflight(sessions, executor == "local", min_free_mb * 2**20)
    # Ray's tasks run on its nodes, and the executor cancels them itself; locally the worker kills its own
    kill = worker_loop.kill_detectors if executor == "local" else (lambda: None)
    with worker_loop.Stopper(kill).installed() as stopper:
        try:
            count = worker_loop.work(
                sessions, runner, once=once, stopper=stopper, preflight=preflight, splits=pool
            )
        except worker_loop.CannotWork as exc:
            worker_loop.logger.error("worker stops: it cannot run the queued jobs: %s", exc)
            raise typer.Exit(worker_loop.EXIT_CANNOT_WORK) from None
    worker_loop.logger.info("%d job(s) run", count)


AS_TEAM_HELP = "Show what members of this team see (default: everything, as the organiser)."


def _render_status(state: status_of.QueueStatus) -> None:
    jobs = ", ".join(f"{k} {v}" for k, v in sorted(state.jobs.items())) or "none"
    console.print(
        f"jobs: {jobs}; {state.stale} stale (no heartbeat for {state.stale_after_s:g} s)", highlight=False
    )
    for j in state.running_jobs:
        beat = j.heartbeat_at.isoformat() if j.heartbeat_at else None
        console.print(
            f"  job {j.job_id} ({j.team}, {j.round}/{j.split}) on {j.worker}: {j.models_done} of "
            f"{j.models_total} models, heartbeat {beat}{' [stale]' if j.stale else ''}",
            highlight=False,
            markup=False,
        )
    for r in state.rounds:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(r.jobs.items())) or "no jobs"
        console.print(f"round {r.name} ({r.status}): {r.submissions} submissions, {counts}", highlight=False)
    console.print(f"workers alive: {len(state.workers)}, {state.unhealthy} unhealthy", highlight=False)
    for w in state.workers:
        doing = f"job {w.job_id}" if w.job_id is not None else "idle"
        health = "healthy" if w.healthy else f"UNHEALTHY: {w.problem}"
        runs = f"runs {','.join(w.kinds) or 'every kind (not recorded)'}"
        serves = f" on {','.join(w.splits)}" if w.splits else ""
        console.print(
            f"  {w.name} (assay {w.version}, {w.isolation}, {w.executor}; {runs}{serves}): {doing}, "
            f"{health}, heartbeat {w.heartbeat_age_s:.0f} s ago",
            highlight=False,
            markup=False,
        )


@app.command()
def status(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Queue depth, jobs by status, each running job's worker and last heartbeat (stale ones marked), each
    round's state, and the live workers (healthy or why not): the web's /leaderboard/status, from the same
    function.

    Example: assay leaderboard status --json
    """
    with _sessions()() as session:
        state = status_of.queue_status(session)
    if json_out:
        console.print(state.model_dump_json(indent=2), highlight=False, markup=False)
    else:
        _render_status(state)


def _render_standings(table: views.StandingsOut) -> None:
    title = f"{table.round}: {table.split}"
    if any("shown_high" in r.metrics for r in table.rows):
        _render_sealed(table, title)
        return
    grid = Table("#", "team", "technique", "CE", "±95%", "AUC", "Brier", "flagged", title=title)
    for r in table.rows:
        m = r.metrics
        grid.add_row(
            str(r.rank),
            r.team,
            r.technique,
            *(
                _cell(m.get(k) if m.get(k) is not None else math.nan)
                for k in ("cross_entropy", "ce_ci_95", "roc_auc", "brier")
            ),
            "at the close" if r.flagged_models is None else str(r.flagged_models),
        )
    console.print(grid)


def _render_sealed(table: views.StandingsOut, title: str) -> None:
    grid = Table("#", "team", "technique", f"test {table.metric} (shown)", "flagged", title=title)
    for r in table.rows:
        rank = f"{r.rank}{'=' if r.tied_with else ''}"
        flagged = "at the close" if r.flagged_models is None else str(r.flagged_models)
        grid.add_row(rank, r.team, r.technique, r.summary, flagged)
    console.print(grid)


@app.command()
def show(
    round_name: str = typer.Argument(..., help="Round name."),
    split: str = typer.Option("test", "--split", help="test, holdout, train or smoke."),
    all_submissions: bool = typer.Option(False, "--all", help="Every submission, not only each team's best."),
    as_team: str | None = typer.Option(None, "--as-team", help=AS_TEAM_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Standings of a round's split (holdout once the round is closed).

    Example: assay leaderboard show r1 --split test --all
    """
    with _sessions()() as session:
        viewer = views.team_viewer(session, as_team)
        table = views.standings_view(session, viewer, round_name, split, best=not all_submissions)
        trend = publish.progress(session, table.round, public=not views.is_organiser(viewer))
    if json_out:
        console.print(publish.to_json(table.rows), highlight=False, markup=False)
        return
    _render_standings(table)
    if trend.overall:
        best = "best" if trend.final else "best so far"
        console.print(f"{best} {trend.metric} {trend.overall[-1][1]:.4f} ({trend.state})", highlight=False)


@app.command()
def export(
    round_name: str = typer.Argument(..., help="Round name."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for standings CSV/JSON and index.html."),
) -> None:
    """Write standings (CSV, JSON; best per team and all) and a static HTML page with ROC plots, as anyone
    may see them: while the round is open, test rows carry their disclosed scores only.

    Example: assay leaderboard export r1 --out site/
    """
    with _sessions()() as session:
        files: dict[str, str] = {}
        splits = ("test", "holdout")
        for split in splits:
            for best, suffix in ((True, "best"), (False, "all")):
                rows = publish.standings(session, round_name, split, best_per_team=best, public=True)
                rows = views.numbered_for(views.Viewer.anonymous(), rows)
                files[f"{split}-{suffix}.csv"] = publish.to_csv(rows)
                files[f"{split}-{suffix}.json"] = publish.to_json(rows)
        files["index.html"] = publish.to_html(session, round_name, public=True)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
    console.print(f"wrote {len(files)} files to {out}", highlight=False)


def _value(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _render_results(record: views.SubmissionOut, logs: bool) -> None:
    console.print(
        f"submission {record.id} ({record.team}) on {record.round}/{record.split}: {record.status}",
        highlight=False,
    )
    if record.sealed:
        console.print(f"score: {record.summary or 'not scored yet'} ({record.note})", highlight=False)
    if record.flag_counts and record.detail != "full":
        counts = ", ".join(f"{n} {flag or 'ok'}" for flag, n in record.flag_counts.items())
        console.print(f"models by flag: {counts} (which model carries which is not shared)", highlight=False)
    if record.detail == "aggregate":
        console.print(f"per-model results of the {record.split} split are not shared", highlight=False)
    if logs and record.detail != "full":
        console.print(f"detector output is not shown for the {record.split} split", highlight=False)
    for r in record.models:
        seconds = "" if r.seconds is None else f"  {duration(r.seconds)}"
        console.print(
            f"{r.model}  {_value(r.answer)}  {r.flags or 'ok'}{seconds}", highlight=False, markup=False
        )
        if logs and r.stderr:
            console.print(r.stderr[-2000:], highlight=False, markup=False)


@app.command()
def results(
    submission_id: int = typer.Argument(..., help="Submission number (from 'submit' or 'show --all')."),
    logs: bool = typer.Option(
        False, "--logs", help="Print the detector's stderr per model (where the viewer is shown it)."
    ),
    as_team: str | None = typer.Option(None, "--as-team", help=AS_TEAM_HELP),
    json_out: bool = typer.Option(
        False, "--json", help="Print the record the web API gives (logs included)."
    ),
) -> None:
    """A submission's per-model answers and flags, as much as the viewer is shown (the web's rule): the
    organiser everything; with --as-team, that team's own submissions only, and on the test split flags only.

    Example: assay leaderboard results 3 --logs --as-team alpha
    """
    with _sessions()() as session:
        viewer = views.team_viewer(session, as_team)
        record = views.submission_view(session, viewer, submission_id)
    if json_out:
        console.print(record.model_dump_json(indent=2), highlight=False, markup=False)
    else:
        _render_results(record, logs)


@image_app.command("build")
def image_build(
    definition: Path = typer.Argument(..., help="The Apptainer definition file (detector.def)."),
    out: Path = typer.Option(..., "--out", help="The image to write: NAME.tar (docker-archive) or NAME.sif."),
    context: Path | None = typer.Option(
        None, "--context", help="Folder relative %files sources are read from (default: the file's folder)."
    ),
    tag: str | None = typer.Option(None, "--tag", help="Also keep the image in podman's storage as TAG."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Build a definition file's common subset (Bootstrap docker/localimage, From, %files, %post,
    %environment, %runscript, %labels, %help) with podman, with no network, into a submittable image.

    Example: assay leaderboard image build detector.def --out detector.sif
    """
    with err_console.status(
        f"building {definition} with podman (a %post that installs packages takes minutes)"
    ):
        built = imagebuild.build_image(definition, out, context=context, tag=tag)
    record = {
        "out": str(built.out),
        "format": built.format,
        "image_id": built.image_id,
        "bytes": built.bytes,
        "seconds": round(built.seconds, 3),
        "tag": built.tag,
    }
    if json_out:
        console.print_json(json.dumps(record))
        return
    kept = f", kept as {built.tag}" if built.tag else ""
    console.print(
        f"built {built.out} ({built.format}, {built.bytes / 2**20:.1f} MiB) in {duration(built.seconds)}: "
        f"image sha256:{built.image_id[:12]}{kept}",
        highlight=False,
    )
    console.print(
        f"submit it: assay leaderboard submit {built.out} --team TEAM --round ROUND", highlight=False
    )
