"""Can any live worker run what a team sends? Asked once, at submission, so an image sent to a round served
only by workers without podman is refused in one line instead of being queued for ever (issue 49).

Each worker records on its row (``fleet.Presence``) the submission kinds it can run, by the same checks its
pre-flight makes before a claim (``machine_kinds``: podman for an image, unsquashfs and a working bubblewrap
for a ``.sif``; a folder or an archive of one always), and the splits it serves (``--splits``).
``refusal`` is what ``submissions.submit`` asks, the one way in for the command line, the pages and the
API. It refuses only on what the fleet says now: with no live worker serving the split it accepts (workers
may start later, and nothing says what they will run), and a row from an older release, which records no
kinds, counts as able to run every kind: a submission is never refused for want of information.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.orm import Session

from assay.leaderboard.fleet import LiveWorker, live_workers
from assay.runner.container import podman_missing, sif_missing

KINDS = ("folder", "archive", "image", "sif")  # as ``Submission.kind`` names them
ALWAYS = ("folder", "archive")  # a detector folder runs wherever a worker runs at all
LABELS = {"image": "container-image", "sif": ".sif"}
NEEDS = {"image": "podman", "sif": "unsquashfs or a working bubblewrap"}
OFFERS = {"image": "an image archive (podman or docker save .tar)", "sif": ".sif"}


def machine_kinds(local: bool = True) -> tuple[str, ...]:
    """The kinds this machine can run, by the pre-flight's checks (``preflight.engine_problem``).

    With a Ray executor (``local`` False) the detectors run on the nodes, which check their own engines at
    run time and which the pre-flight does not probe either: every kind.
    """
    if not local:
        return KINDS
    engines = {"image": podman_missing, "sif": sif_missing}
    return (*ALWAYS, *(kind for kind, missing in engines.items() if missing() is None))


def serves(worker: LiveWorker, split: str) -> bool:
    """Whether ``worker`` takes jobs on ``split`` (no splits recorded: every split)."""
    return not worker.splits or split in worker.splits


def can_run(worker: LiveWorker, kind: str) -> bool:
    """Whether ``worker`` can run a submission of ``kind``; a row without kinds (an older release) can."""
    return not worker.kinds or kind in worker.kinds


def _either(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def refusal(
    session: Session, round_name: str, split: str, kind: str, now: datetime | None = None
) -> str | None:
    """The one line refusing a ``kind`` submission to ``round_name``'s ``split`` when live workers serve
    the split and none can run it, naming what they lack and what they can run; None to accept."""
    if kind in ALWAYS or kind not in KINDS:
        return None
    serving = [w for w in live_workers(session, now) if serves(w, split)]
    if not serving or any(can_run(w, kind) for w in serving):
        return None
    runnable: Iterable[str] = {k for w in serving for k in w.kinds}
    offers = ["a detector folder", ".tar.gz", ".zip", *(OFFERS[k] for k in ("sif", "image") if k in runnable)]
    return (
        f"round {round_name}: no live worker can run {LABELS[kind]} submissions (its workers lack "
        f"{NEEDS[kind]}); submit {_either(offers)}"
    )
