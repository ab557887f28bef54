"""Who sees what of the leaderboard, and the read models every face hands out.

The one home of the sharing rule: the web pages, the JSON API and ``assay leaderboard show/results`` call
these functions and only render what comes back, so a rule holds everywhere or nowhere. A ``Viewer`` is who
asks: the web builds one from the signed-in account (roles, linked team); the command line is the
organiser's tool on the server and asks as the organiser unless ``--as-team TEAM`` is given.

- Rounds and their test standings: everyone signed in (draft rounds: organisers only). A standings row is
  the public aggregate only: rank, team, technique, overall metrics, number of flagged models. Train and
  smoke standings (practice runs) are the organisers'.
- Visitors who are not signed in (``Viewer.anonymous``): the rounds an organiser made public
  (``Round.public``, not drafts), seen exactly as a member of no team sees them: the rounds list, test
  standings (a sealed score as its disclosed interval), holdout after the close. No submission, job or log
  exists for them, and a private round is not there (``NotVisible``, as one that does not exist).
- Holdout: organisers always; everyone else only once the round is closed. Before that holdout standings and
  holdout submissions do not exist for them (``NotVisible``: a 404 on the web), not shown empty.
- A submission, its job and its logs: members of the submitting team and organisers; to anyone else the
  submission does not exist. How much detail the team sees depends on the split (``detail_level``): train
  and smoke, whose ground truth the team holds: everything (each model's answer, the truth, flags, exit code,
  time, the detector's stderr, metrics by METADATA factor); test, while the round is open: nothing but
  "submitted" until the job is published on the round's clock, then the disclosed score alone
  (``sealed_phase``, ``sealing.phase``: one frozen record, then one showing; ``disclosure``: at most the
  round's ``leak_bits`` bits about the test labels; no exact metric, CI, ROC curve, group, flag count or
  log line until the close: a detector must not carry facts about sequestered models out); holdout: the
  overall metrics and ROC only. Organisers see everything. Public standings and progress of an open
  round's test split use the published, disclosed scores alone.
- The same files from another team (``duplicate_of``): named only to a viewer who may see the original,
  which for another team's submission is the organiser.
- Uploads: members of a team (``submitting_team``); the queue and worker status: organisers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.leaderboard import publish, rounds, scoring, sealing, submissions
from assay.leaderboard.disclosure import is_sealed, labels_secret, public_metrics, sealed_note
from assay.leaderboard.publish import Progress, Standing
from assay.leaderboard.scoring import read_truth
from assay.leaderboard.sealing import SILENT_STATUS, Phase, schedule_words, shown_status
from assay.leaderboard.status import JobProgress, QueueStatus, job_progress, queue_status, sealed_progress
from assay.store.enums import FINISHED_JOBS, Role, RoundStatus
from assay.store.models import SPLIT_NAMES, Job, MetricResult, Round, Submission, Team, as_utc, utcnow
from assay.store.paging import Window, page_of

PUBLIC_STANDINGS = ("test", "holdout")  # splits whose standings are not the organisers' alone
Detail = Literal["full", "errors", "aggregate"]


# --- who asks, and the refusals ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    """Who asks: their roles and the team their account belongs to (if any)."""

    roles: frozenset[str]
    team: str | None = None
    signed_in: bool = True  # False: a visitor of the public standings, who has no account

    @classmethod
    def anonymous(cls) -> Viewer:
        """A visitor who is not signed in: no role and no team, and only the rounds made public."""
        return cls(frozenset(), None, signed_in=False)

    @classmethod
    def organiser(cls) -> Viewer:
        """The organiser: the command line's viewer on the server, which sees everything."""
        return cls(frozenset({Role.ORGANISER}))

    @classmethod
    def member_of(cls, team: str) -> Viewer:
        """A member of ``team``: what ``--as-team`` asks as, to see the board through a team's eyes."""
        return cls(frozenset({Role.TEAM_MEMBER}), team)


class NotVisible(UserError):
    """The thing does not exist for this viewer (a 404 on the web), so its existence is not leaked."""


class NotAllowed(UserError):
    """The viewer may see the page but not do this (a 403 on the web)."""


def team_viewer(session: Session, team: str | None) -> Viewer:
    """The command line's viewer: the organiser, or a member of ``team`` (which must exist)."""
    if team is None:
        return Viewer.organiser()
    return Viewer.member_of(rounds.get_team(session, team).name)


# --- the rule: one function per decision ------------------------------------------------------------------


def is_organiser(viewer: Viewer) -> bool:
    """Organisers run the board: they see every round, submission and log."""
    return Role.ORGANISER in viewer.roles


def team_of(viewer: Viewer) -> str | None:
    """The team whose submissions the viewer may see and make: only team members (or organisers) have one."""
    has_role = is_organiser(viewer) or Role.TEAM_MEMBER in viewer.roles
    return viewer.team if has_role else None


def may_see_round(viewer: Viewer, round_: Round) -> bool:
    """A draft round is still being set up: organisers only. A visitor who is not signed in sees only the
    rounds an organiser made public."""
    if not viewer.signed_in and not round_.public:
        return False
    return round_.status != RoundStatus.DRAFT or is_organiser(viewer)


def holdout_hidden(viewer: Viewer, round_: Round) -> bool:
    """Holdout results stay with the organisers until the round closes."""
    return round_.status not in (RoundStatus.CLOSED, RoundStatus.ARCHIVED) and not is_organiser(viewer)


def may_see(viewer: Viewer, submission: Submission) -> bool:
    """Organisers see every submission; a team member their own team's, holdout ones once it is public."""
    if is_organiser(viewer):
        return True
    team = team_of(viewer)
    round_ = submission.split.round
    hidden = not may_see_round(viewer, round_) or (
        submission.split.name == "holdout" and holdout_hidden(viewer, round_)
    )
    return team is not None and submission.team.name == team and not hidden


def detail_level(viewer: Viewer, submission: Submission) -> Detail:
    """How much of a visible submission the viewer sees (the module docstring gives the rule and why)."""
    if is_organiser(viewer) or submission.split.show_logs:
        return "full"
    return "errors" if submission.split.name == "test" else "aggregate"


def may_open(viewer: Viewer, row: Standing) -> bool:
    """Whether a standings row links to its submission for this viewer: organisers' and the team's own."""
    team = team_of(viewer)
    return is_organiser(viewer) or (team is not None and row.team == team)


def numbered_for(viewer: Viewer, rows: list[Standing]) -> list[Standing]:
    """``rows`` as ``viewer`` gets them: a row carries its submission's number only where the viewer may
    open it, since the numbers count every round's submissions (issue 47, item 8)."""
    return [row if may_open(viewer, row) else row.unnumbered() for row in rows]


def submitting_team(viewer: Viewer) -> str:
    """The team an upload is made for; ``NotAllowed`` for anyone who belongs to none."""
    team = team_of(viewer)
    if team is None:
        raise NotAllowed("only members of a team can submit: ask an organiser to add you to one")
    return team


# --- finding things the viewer may see --------------------------------------------------------------------


def find_round(session: Session, viewer: Viewer, name: str) -> Round:
    """The round called ``name``, or ``NotVisible`` (no such round, or a draft for a non-organiser)."""
    found = session.scalar(select(Round).where(Round.name == name))
    if found is None or not may_see_round(viewer, found):
        raise NotVisible(f"no round named {name!r}")
    return found


def find_submission(session: Session, viewer: Viewer, submission_id: int) -> Submission:
    """Submission ``submission_id`` if the viewer may see it, else ``NotVisible``."""
    found = session.get(Submission, submission_id)
    if found is None or not may_see(viewer, found):
        raise NotVisible(f"no submission {submission_id}")
    return found


def find_job(session: Session, viewer: Viewer, job_id: int) -> Job:
    """Job ``job_id`` if the viewer may see its submission, else ``NotVisible``."""
    found = session.get(Job, job_id)
    if found is None or not may_see(viewer, found.submission):
        raise NotVisible(f"no job {job_id}")
    return found


# --- read models --------------------------------------------------------------------------------------------


class RoundOut(BaseModel):
    """A round as anyone who may see it sees it."""

    name: str
    status: str
    metric: str
    lower_is_better: bool  # the metric's ranking direction (publish.lower_is_better), for pages to state
    submission_window_s: int
    plateau_delta: float
    plateau_days: float
    opened_at: datetime | None
    closed_at: datetime | None
    splits: list[str]
    disclosure: str = "refined"  # how an open round shows test scores (``disclosure.MODES``)
    leak_bits: float = 8.0
    public: bool = False  # visitors who are not signed in may read its standings
    gpus: int = 0  # NVIDIA GPUs each detector run holds (0: a CPU round)
    publish_every_s: int = sealing.DEFAULT_PUBLISH_EVERY_S  # the round's clock (``sealing``)
    publication: str = "every hour on the hour"  # the clock in words


class StandingsOut(BaseModel):
    """A split's ranked public rows."""

    round: str
    split: str
    metric: str
    best_per_team: bool
    rows: list[Standing]


class ModelRow(BaseModel):
    """One model of a job; ``answer``, ``truth``, ``exit_code``, ``seconds`` and ``stderr`` at "full" only."""

    model: str
    flags: str
    answer: float | None = None
    truth: int | None = None
    exit_code: int | None = None
    seconds: float | None = None
    stderr: str | None = None


class SubmissionOut(BaseModel):
    """A submission, its job, metrics, per-model results and harness log, cut to the viewer's detail."""

    id: int
    team: str
    round: str
    split: str
    status: str
    technique: str
    submitted_at: datetime
    sha256: str
    validation_errors: list[str]
    duplicate_of: int | None
    job: JobProgress | None
    detail: Detail
    sealed: bool  # the test split of an open round, as a non-organiser sees it: the disclosed score only
    metrics: dict[str, float | None]
    flag_counts: dict[str, int]
    groups: dict[str, dict[str, dict[str, float | None]]]
    models: list[ModelRow]
    log: str
    summary: str = ""  # a sealed score in plain words, ranked among every test submission
    note: str = ""  # what the sealed interval guarantees (``disclosure.sealed_note``)


class SubmissionRow(BaseModel):
    """One line of a team's list of its submissions."""

    id: int
    split: str
    status: str
    technique: str
    submitted_at: datetime
    job_id: int | None


class SubmissionLogs(BaseModel):
    """The harness's notes, and each model's detector output where the viewer is shown it."""

    submission_id: int
    team: str
    round: str
    split: str
    status: str
    harness_log: str
    detector_output_shared: bool
    models: list[ModelRow]


class RoundBoard(BaseModel):
    """Everything the round page shows this viewer; ``holdout`` is None while it is hidden from them."""

    round: RoundOut
    team: str | None
    best: list[Standing]
    every: list[Standing]
    holdout: list[Standing] | None
    linkable: set[int]
    trend: Progress
    own: list[SubmissionRow]
    window: datetime | None
    warning: str | None = None  # the organiser's: the disclosure budget reveals the whole test split


class UploadForm(BaseModel):
    """What the upload page shows a team: the round, when its next test submission may come, its latest."""

    round: RoundOut
    team: str
    window: datetime | None
    own: list[SubmissionRow]


class RoundListing(BaseModel):
    """A round as the organiser lists it: its data set folder and the number of models per split."""

    name: str
    status: str
    dataset: str
    metric: str
    splits: dict[str, int]
    public: bool = False
    gpus: int = 0


class TeamListing(BaseModel):
    """A team as the organiser lists it (contacts are the organiser's only)."""

    name: str
    contact: str
    kind: str
    disabled: bool


# --- building them ------------------------------------------------------------------------------------------


def round_out(round_: Round) -> RoundOut:
    """The public facts of a round."""
    return RoundOut(
        name=round_.name,
        status=round_.status,
        metric=round_.metric,
        lower_is_better=publish.lower_is_better(round_.metric),
        submission_window_s=round_.submission_window_s,
        plateau_delta=round_.plateau_delta,
        plateau_days=round_.plateau_days,
        opened_at=as_utc(round_.opened_at),
        closed_at=as_utc(round_.closed_at),
        splits=[name for name in SPLIT_NAMES if name in {s.name for s in round_.splits}],
        disclosure=round_.disclosure,
        leak_bits=round_.leak_bits,
        public=round_.public,
        gpus=round_.gpus,
        publish_every_s=round_.publish_every_s,
        publication=schedule_words(round_.publish_every_s),
    )


def visible_rounds(
    session: Session, viewer: Viewer, window: Window | None = None
) -> tuple[list[RoundOut], int]:
    """A window of the rounds the viewer may see (``may_see_round`` as a query), newest first; the total."""
    query = select(Round).order_by(Round.id.desc())
    if not is_organiser(viewer):
        query = query.where(Round.status != RoundStatus.DRAFT)
    if not viewer.signed_in:
        query = query.where(Round.public.is_(True))
    found, total = page_of(session, query, window or Window())
    return [round_out(r) for r in found], total


def standings_view(
    session: Session, viewer: Viewer, name: str, split: str, best: bool = True, now: datetime | None = None
) -> StandingsOut:
    """Ranked public rows of a round's split; ``NotVisible`` for holdout before close, practice splits to
    teams, or a round the viewer may not see."""
    round_ = find_round(session, viewer, name)
    rounds.get_split(round_, split)  # a UserError naming the splits there are (public: see ``round_out``)
    if split not in PUBLIC_STANDINGS and not is_organiser(viewer):
        raise NotVisible(f"standings of the {split} split are for the organisers")
    if split == "holdout" and holdout_hidden(viewer, round_):
        raise NotVisible("holdout standings are published when the round closes")
    rows = publish.standings(
        session, round_.name, split, best_per_team=best, public=not is_organiser(viewer), now=now
    )
    rows = numbered_for(viewer, rows)
    return StandingsOut(round=round_.name, split=split, metric=round_.metric, best_per_team=best, rows=rows)


def _truth(submission: Submission) -> dict[str, int]:
    try:
        return read_truth(submission.split.truth_path)
    except UserError:  # a moved round folder: the page still shows what the store holds
        return {}


def _model_rows(submission: Submission, detail: Detail) -> list[ModelRow]:
    """Per-model rows at "full" detail only: a flag by model name is a channel out of a sealed run."""
    if submission.job is None or detail != "full":
        return []
    results = sorted(submission.job.results, key=lambda r: r.model_name)
    truth = _truth(submission)
    return [
        ModelRow(
            model=r.model_name,
            flags=r.flags,
            answer=r.value,
            truth=truth.get(r.model_name),
            exit_code=r.exit_code,
            seconds=round(r.wall_seconds, 3),
            stderr=r.stderr,
        )
        for r in results
    ]


MetricRow = tuple[str, str, str, float | None]  # name, METADATA column ("" overall), its value, the score


def _metric_rows(session: Session, job: Job | None) -> list[MetricRow]:
    """A job's scores as plain rows: a read model needs only the numbers, not hundreds of tracked objects."""
    if job is None:
        return []
    columns = (MetricResult.name, MetricResult.group_column, MetricResult.group_value, MetricResult.value)
    return list(session.execute(select(*columns).where(MetricResult.job_id == job.id)).tuples())


def _groups(rows: list[MetricRow], detail: Detail) -> dict[str, dict[str, dict[str, float | None]]]:
    """Metrics by METADATA factor: they say how the detector did on groups of models, so "full" only."""
    groups: dict[str, dict[str, dict[str, float | None]]] = {}
    if detail == "full":
        for name, column, value, score in rows:
            if column:
                groups.setdefault(column, {}).setdefault(value, {})[name] = score
    return groups


CLEAN_GROUP = "clean (no trigger)"  # a blank factor over clean models only (the zoo's trigger facts)
BLANK_GROUP = "none (blank in METADATA)"  # a blank factor over some trojaned models too (source_class)


def group_name(column: str, value: str, metrics: dict[str, float | None]) -> str:
    """A METADATA group's name as a page shows it. The zoo leaves a factor empty where it does not apply
    (every trigger fact of a clean model), so a blank value is named from its models: "clean (no trigger)"
    when none of them is trojaned (``positives`` 0), else "none"; in a cross product (``[a=x][b=]``) each
    blank part alike. Other values are shown as they are."""
    clean = metrics.get("positives") == 0
    if scoring.CROSS in column:
        return value.replace("=]", "=clean]" if clean else "=none]")
    if value.strip():
        return spec_in_words(value)
    return CLEAN_GROUP if clean else BLANK_GROUP


def spec_in_words(value: str) -> str:
    """A METADATA value holding a JSON spec (the zoo's ``trigger`` column) in words, kind first:
    ``{"kind":"solid_patch","size":4}`` reads "solid patch: size 4" (issue 47: the "By trigger" table showed
    the raw JSON). Any other value is shown as it is."""
    try:
        spec = json.loads(value)
    except ValueError:
        return value
    if not isinstance(spec, dict) or not spec:
        return value
    kind = _words(spec.pop("kind", ""))
    facts = ", ".join(f"{_words(key)} {_words(fact)}" for key, fact in spec.items())
    return f"{kind}: {facts}" if kind and facts else kind or facts


def _words(fact: object) -> str:
    """One fact of a spec in words: names with spaces for underscores, a list as a tuple."""
    if isinstance(fact, list):
        return "(" + ", ".join(_words(item) for item in fact) + ")"
    return str(fact).replace("_", " ")


def _flag_counts(submission: Submission, detail: Detail, hidden: bool) -> dict[str, int]:
    """How many of the job's models carry each NIST flag ("" = none): the test split's only per-model fact.
    While the job's progress is ``hidden`` (``_hides_progress``), none until it has finished: counts that
    grow as results arrive would be the count of models done that the job page keeps back."""
    if submission.job is None or detail == "aggregate":
        return {}
    if hidden and submission.job.status not in FINISHED_JOBS:
        return {}
    counts: dict[str, int] = {}
    for result in submission.job.results:
        counts[result.flags] = counts.get(result.flags, 0) + 1
    return dict(sorted(counts.items()))


def _duplicate_of(session: Session, viewer: Viewer, submission: Submission) -> int | None:
    """The original of the same files, named only if the viewer may see it."""
    if submission.duplicate_of_id is None:
        return None
    original = session.get(Submission, submission.duplicate_of_id)
    return original.id if original is not None and may_see(viewer, original) else None


def sealed_phase(viewer: Viewer, submission: Submission, now: datetime | None = None) -> Phase:
    """What the viewer may observe of the submission's job now (``sealing.phase``): the one question every
    record, job, log and list of this module asks before it says anything about a job."""
    split = submission.split
    return sealing.phase(split.round, split.name, submission.job, now or utcnow(), is_organiser(viewer))


def _silent_note(round_: Round) -> str:
    return (
        f"its result is published on the round's clock ({schedule_words(round_.publish_every_s)}), never "
        "when a job happens to finish; until then all that shows of it is that it was submitted, and when"
    )


def _silent(viewer: Viewer, submission: Submission) -> SubmissionOut:
    """A sealed submission before its publication: that it was submitted, and when. Nothing in it moves
    while the job waits, runs or finishes."""
    assert submission.job is not None  # a submission with no job is never silent (``sealing.phase``)
    return SubmissionOut(
        id=submission.id,
        team=submission.team.name,
        round=submission.split.round.name,
        split=submission.split.name,
        status=SILENT_STATUS,
        technique=submission.technique,
        submitted_at=as_utc(submission.submitted_at),
        sha256=submission.artifact_sha256,
        validation_errors=[],
        duplicate_of=None,
        job=sealed_progress(submission.job, None),
        detail=detail_level(viewer, submission),
        sealed=True,
        metrics={},
        flag_counts={},
        groups={},
        models=[],
        log=SEALED_LOG,
        note=_silent_note(submission.split.round),
    )


SHOWN_NOTE = "; its flag counts and harness log are shown when the round closes"
SEALED_LOG = "(sealed: the harness log of this job is shown when the round closes)\n"


def _shown(record: SubmissionOut, submission: Submission) -> SubmissionOut:
    """A sealed submission once published while the labels are secret: the showing (its disclosed score
    and whether it scored) and the publication time; flags and log lines are facts the detector chose
    about sequestered models, outside the showing, so they wait for the close."""
    assert submission.job is not None
    published = sealing.published_at(submission.split.round, submission.job)
    return record.model_copy(
        update={
            "status": shown_status(submission.status),
            "job": sealed_progress(submission.job, published),
            "flag_counts": {},
            "log": SEALED_LOG,
            "note": record.note + SHOWN_NOTE,
        }
    )


def _describe(
    session: Session, viewer: Viewer, submission: Submission, now: datetime | None = None
) -> SubmissionOut:
    """A submission already found visible (``find_submission``), cut to the viewer's ``detail_level`` and
    to what its ``sealed_phase`` lets them observe."""
    phase = sealed_phase(viewer, submission, now)
    if phase == "silent":
        return _silent(viewer, submission)
    record = _open_record(session, viewer, submission)
    return _shown(record, submission) if phase == "shown" else record


def _open_record(session: Session, viewer: Viewer, submission: Submission) -> SubmissionOut:
    """Everything the viewer's ``detail_level`` allows of a submission whose job is not silent."""
    detail = detail_level(viewer, submission)
    job = submission.job
    scores = _metric_rows(session, job)
    overall = {name: score for name, column, _, score in scores if not column}
    sealed = not is_organiser(viewer) and is_sealed(submission.split.round, submission.split.name)
    hidden = _hides_progress(viewer, submission)
    return SubmissionOut(
        id=submission.id,
        team=submission.team.name,
        round=submission.split.round.name,
        split=submission.split.name,
        status=submission.status,
        technique=submission.technique,
        submitted_at=as_utc(submission.submitted_at),
        sha256=submission.artifact_sha256,
        validation_errors=submission.validation_errors.splitlines(),
        duplicate_of=_duplicate_of(session, viewer, submission),
        job=_job_record(session, viewer, submission, "open"),
        detail=detail,
        sealed=sealed,
        metrics=overall if is_organiser(viewer) else public_metrics(overall, sealed),
        flag_counts=_flag_counts(submission, detail, hidden),
        groups=_groups(scores, detail),
        models=_model_rows(submission, detail),
        log=job.log if job is not None else "",
        summary=_sealed_summary(session, submission) if sealed else "",
        note=sealed_note(overall) if sealed else "",
    )


def _job_record(session: Session, viewer: Viewer, submission: Submission, phase: Phase) -> JobProgress | None:
    """The submission's job as the viewer may observe it in ``phase``."""
    job = submission.job
    if job is None:
        return None
    if phase != "open":
        published = sealing.published_at(submission.split.round, job) if phase == "shown" else None
        return sealed_progress(job, published)
    hide = _hides_progress(viewer, submission)
    return job_progress(session, job, hide=hide, public=not is_organiser(viewer))


def _sealed_summary(session: Session, submission: Submission) -> str:
    """The submission's row of the public test standings (every submission), in plain words."""
    rows = publish.standings(session, submission.split.round.name, "test", best_per_team=False, public=True)
    return next((row.summary for row in rows if row.submission_id == submission.id), "")


def submission_view(
    session: Session, viewer: Viewer, submission_id: int, now: datetime | None = None
) -> SubmissionOut:
    """Submission ``submission_id`` as the viewer may see it, or ``NotVisible``."""
    return _describe(session, viewer, find_submission(session, viewer, submission_id), now)


def _hides_progress(viewer: Viewer, submission: Submission) -> bool:
    """While the test labels are secret, a team sees its job as queued, running or finished, never how
    many models are done nor when to the second: each step is one model's run time, which a detector
    controls, and the times would tie facts about models to moments of the run."""
    return not is_organiser(viewer) and labels_secret(submission.split.round, submission.split.name)


def job_view(session: Session, viewer: Viewer, job_id: int, now: datetime | None = None) -> JobProgress:
    """A job's progress, for whoever may see its submission (``sealed_phase`` says how much)."""
    submission = find_job(session, viewer, job_id).submission
    record = _job_record(session, viewer, submission, sealed_phase(viewer, submission, now))
    assert record is not None  # the job was found
    return record


def submission_logs(
    session: Session, viewer: Viewer, submission_id: int, now: datetime | None = None
) -> SubmissionLogs:
    """The harness log (none of a sealed job until the close); each model's stderr only at "full"."""
    record = submission_view(session, viewer, submission_id, now)
    shared = record.detail == "full"
    return SubmissionLogs(
        submission_id=record.id,
        team=record.team,
        round=record.round,
        split=record.split,
        status=record.status,
        harness_log=record.log,
        detector_output_shared=shared,
        models=record.models if shared else [],
    )


def roc_svg(session: Session, record: SubmissionOut, size: int = 240) -> str:
    """The ROC curve of a visible, scored submission as inline SVG; "" when unscored, sealed (it would show
    the labels' order against the detector's answers) or its truth moved."""
    if not record.metrics or record.sealed:
        return ""
    try:
        return publish.roc_svg(session, record.id, size=size)
    except UserError:  # the round's truth folder moved: the scores in the store are still worth showing
        return ""


def _row(submission: Submission, phase: Phase) -> SubmissionRow:
    job = submission.job
    status = {"open": submission.status, "silent": SILENT_STATUS}.get(phase, shown_status(submission.status))
    return SubmissionRow(
        id=submission.id,
        split=submission.split.name,
        status=status,
        technique=submission.technique,
        submitted_at=as_utc(submission.submitted_at),
        job_id=job.id if job is not None else None,
    )


def team_submissions(
    session: Session, viewer: Viewer, round_: Round, now: datetime | None = None
) -> list[SubmissionRow]:
    """The viewer's team's submissions to the round that the viewer may see, newest first, each sealed
    job's status as ``sealed_phase`` lets the viewer observe it."""
    team = team_of(viewer)
    if team is None:
        return []
    found = session.scalars(
        select(Submission)
        .join(Team, Submission.team_id == Team.id)
        .where(Team.name == team, Submission.split_id.in_([s.id for s in round_.splits]))
        .order_by(Submission.id.desc())
    )
    now = now or utcnow()
    return [_row(s, sealed_phase(viewer, s, now)) for s in found if may_see(viewer, s)]


def window_reopens(session: Session, team: str, round_: Round) -> datetime | None:
    """When the team may next submit to the round's test split (None: now)."""
    test = rounds.get_split(round_, "test")
    team_id = rounds.get_team(session, team).id
    return submissions.window_reopens_at(session, team_id, test.id, round_.submission_window_s, utcnow())


def round_board(session: Session, viewer: Viewer, name: str, now: datetime | None = None) -> RoundBoard:
    """The round page: test standings, holdout once the viewer may see it, the team's own submissions."""
    round_ = find_round(session, viewer, name)
    team = team_of(viewer)
    public = not is_organiser(viewer)
    now = now or utcnow()
    every = publish.standings(session, round_.name, "test", best_per_team=False, public=public, now=now)
    holdout = (
        None
        if holdout_hidden(viewer, round_)
        else publish.standings(session, round_.name, "holdout", public=public, now=now)
    )
    best = publish.best_of(every, round_.metric, public and is_sealed(round_, "test"))
    return RoundBoard(
        round=round_out(round_),
        team=team,
        best=numbered_for(viewer, best),
        every=numbered_for(viewer, every),
        holdout=None if holdout is None else numbered_for(viewer, holdout),
        linkable={r.submission_id for r in every + (holdout or []) if may_open(viewer, r)},
        trend=publish.progress(session, round_.name, public=public, every=every),
        own=team_submissions(session, viewer, round_, now),
        window=window_reopens(session, team, round_) if team is not None else None,
        warning=rounds.disclosure_warning(round_) if is_organiser(viewer) else None,
    )


def upload_form(session: Session, viewer: Viewer, name: str, latest: int = 5) -> UploadForm:
    """The upload page: ``NotVisible`` for an unseen round, ``NotAllowed`` for a viewer with no team."""
    round_ = find_round(session, viewer, name)
    team = submitting_team(viewer)
    return UploadForm(
        round=round_out(round_),
        team=team,
        window=window_reopens(session, team, round_),
        own=team_submissions(session, viewer, round_, utcnow())[:latest],
    )


def queue_view(session: Session, viewer: Viewer) -> QueueStatus:
    """The queue and worker status (``status.queue_status``): organisers only, ``NotAllowed`` otherwise."""
    if not is_organiser(viewer):
        raise NotAllowed("the queue and worker status is for organisers")
    return queue_status(session)


def round_listing(session: Session) -> list[RoundListing]:
    """Every round with its data set and split sizes, oldest first: the organiser's list."""
    return [
        RoundListing(
            name=r.name,
            status=r.status,
            dataset=r.dataset,
            metric=r.metric,
            splits={s.name: len(rounds.split_models(s)) for s in r.splits},
            public=r.public,
            gpus=r.gpus,
        )
        for r in session.scalars(select(Round).order_by(Round.id))
    ]


def team_listing(session: Session) -> list[TeamListing]:
    """Every team with its contact, oldest first: the organiser's list."""
    return [
        TeamListing(name=t.name, contact=t.contact, kind=t.kind, disabled=t.disabled)
        for t in session.scalars(select(Team).order_by(Team.id))
    ]
