"""One sharing rule for every face: the same visibility cases through the command line and the JSON API.

The cases: the organiser, a member of the submitting team, a member of another team (and a signed-in viewer
with no team, and nobody, which only the web has: a visitor who is not signed in sees a public round as a
member of no team, and a private one not at all) x train, smoke, test and holdout submissions, a team's
own duplicate and another team's identical-bytes copy (``duplicate_of`` pointing across teams), with the
round open and then closed, and a draft round. Each case's answer, the record or "not there", must be what
the rule says and the same from ``assay leaderboard results/show --json`` (as the organiser, or with
``--as-team``) as from ``/api/v1/leaderboard``. The table runs the CLI in-process (each ``python -m assay``
start costs seconds); a sample runs it as a real subprocess too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.leaderboard import rounds, views
from assay.leaderboard.cli import app as leaderboard_cli
from assay.leaderboard.views import Viewer
from assay.store import Submission
from assay.web import accounts
from assay.web.app import create_app
from fake_board import ANSWERS, TRUTH, fake_splits, scored
from web_client import PASSWORD, signed_in

PROJECT = Path(__file__).resolve().parents[2]
# who asks: (web account, command-line options)
VIEWERS = {
    "organiser": ("olga", []),
    "alpha": ("tom", ["--as-team", "alpha"]),
    "beta": ("bea", ["--as-team", "beta"]),
}
SUBMISSIONS = (
    "alpha-train",
    "alpha-smoke",
    "alpha-test",
    "alpha-holdout",
    "alpha-again",
    "beta-test",
    "beta-copy",
)
# What each viewer sees of each submission, round open then closed: its detail level, or None (not there).
EXPECTED: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "organiser": dict.fromkeys(SUBMISSIONS, ("full", "full")),
    "alpha": {
        "alpha-train": ("full", "full"),  # the team holds the train split's truth: everything
        "alpha-smoke": ("full", "full"),
        "alpha-test": ("errors", "errors"),  # sequestered: flags only
        "alpha-holdout": (None, "aggregate"),  # hidden until the round closes, then the scores only
        "alpha-again": ("errors", "errors"),  # its own duplicate
        "beta-test": (None, None),
        "beta-copy": (None, None),
    },
    "beta": {
        **dict.fromkeys(SUBMISSIONS, (None, None)),
        "beta-test": ("errors", "errors"),
        "beta-copy": ("errors", "errors"),
    },
    "vic": dict.fromkeys(SUBMISSIONS, (None, None)),  # signed in, no team: standings only
}
# whose original a duplicate may name: the organiser both, alpha its own, beta not alpha's
DUPLICATE_SHOWN = {("organiser", "beta-copy"), ("organiser", "alpha-again"), ("alpha", "alpha-again")}


class Board:
    """The web app over one SQLite file, its submissions by name, and the API clients by viewer."""

    def __init__(self, app: FastAPI, ids: dict[str, int]) -> None:
        self.app, self.ids = app, ids
        self.clients = {name: signed_in(app, user) for name, (user, _) in VIEWERS.items()}
        self.clients["vic"] = signed_in(app, "vic")

    def close(self) -> None:
        with self.app.state.sessions.begin() as session:
            rounds.set_status(session, "r1", "closed")


def _copy_of(app: FastAPI, original: int, team: str, status: str, scored_id: int | None) -> int:
    """Make submission ``scored_id`` (or a new unrun one) hold the same files as ``original``."""
    with app.state.sessions.begin() as session:
        source = session.get(Submission, original)
        assert source is not None
        if scored_id is None:
            copy = Submission(team=rounds.get_team(session, team), split=source.split, artifact_path="/x")
            session.add(copy)
        else:
            copy = session.get(Submission, scored_id)  # type: ignore[assignment]
        copy.artifact_sha256, copy.duplicate_of_id, copy.status = source.artifact_sha256, source.id, status
        session.flush()
        return copy.id


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Board:
    monkeypatch.setenv("ASSAY_ARGON2_FAST", "1")
    url = f"sqlite:///{tmp_path / 'web.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)  # what the command line opens
    app = create_app_with_people(url, tmp_path)
    sessions = app.state.sessions
    ids = {
        f"alpha-{split}": scored(sessions, "alpha", split, ANSWERS) for split in ("train", "smoke", "holdout")
    }
    ids["alpha-test"] = scored(sessions, "alpha", "test", ANSWERS, ago_h=3)
    ids["beta-test"] = scored(sessions, "beta", "test", dict.fromkeys(TRUTH, 0.5))
    beta_copy = scored(sessions, "beta", "test", ANSWERS, ago_h=1)  # alpha's bytes, run for beta
    ids["beta-copy"] = _copy_of(app, ids["alpha-test"], "beta", "done", beta_copy)
    ids["alpha-again"] = _copy_of(app, ids["alpha-test"], "alpha", "duplicate", None)  # not run again
    return Board(app, ids)


def create_app_with_people(url: str, tmp_path: Path) -> FastAPI:
    """An open round r1, a draft round r2, teams alpha and beta, and one account per kind of viewer."""
    app = create_app(url)
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=3600)
        rounds.set_status(session, "r1", "open")
        rounds.create_round(session, "r2", tmp_path / "splits")
        alpha, beta = rounds.add_team(session, "alpha"), rounds.add_team(session, "beta")
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
        accounts.create_user(session, "bea", PASSWORD, ["team_member"], team=beta)
        accounts.create_user(session, "vic", PASSWORD, ["viewer"], team=alpha)  # linked, but not a member
    return app


# --- the two faces, each answering with the record or None ("not there for you") -------------------------


def cli(*args: str) -> Any | None:
    """``assay leaderboard ARGS --json`` in-process; None where the pillar refuses with ``NotVisible``."""
    result = CliRunner().invoke(leaderboard_cli, [*args, "--json"])
    if isinstance(result.exception, views.NotVisible):
        return None
    assert result.exit_code == 0, (args, result.output, result.exception)
    return json.loads(result.stdout)


def api(client: TestClient, path: str, **params: Any) -> Any | None:
    """``GET /api/v1/leaderboard/PATH``; None for a 404."""
    response = client.get(f"/api/v1/leaderboard{path}", params=params)
    if response.status_code == 404:
        return None
    assert response.status_code == 200, (path, response.text)
    return response.json()


def results_both(board: Board, viewer: str, submission: str) -> Any | None:
    """One submission for one viewer from both faces, asserted equal."""
    sub_id = board.ids[submission]
    from_cli = cli("results", str(sub_id), *VIEWERS[viewer][1])
    from_api = api(board.clients[viewer], f"/submissions/{sub_id}")
    assert from_cli == from_api, (viewer, submission)
    return from_api


def standings_both(board: Board, viewer: str, round_name: str, split: str, every: bool) -> Any | None:
    """One round's standings for one viewer from both faces (the CLI prints the rows), asserted equal."""
    extra = ["--all"] if every else []
    from_cli = cli("show", round_name, "--split", split, *extra, *VIEWERS[viewer][1])
    table = api(board.clients[viewer], f"/rounds/{round_name}/standings", split=split, all=every)
    from_api = None if table is None else table["rows"]
    assert from_cli == from_api, (viewer, round_name, split, every)
    return from_api


# --- the table -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [0, 1], ids=["open", "closed"])
def test_submissions_look_the_same_from_the_cli_and_the_api(board: Board, phase: int) -> None:
    if phase:
        board.close()
    for viewer in VIEWERS:
        for submission in SUBMISSIONS:
            record = results_both(board, viewer, submission)
            expected = EXPECTED[viewer][submission][phase]
            assert (record["detail"] if record else None) == expected, (viewer, submission)
            if record is None:
                continue
            shows_answers = expected == "full"
            assert all((m["answer"] is not None) == shows_answers for m in record["models"])
            assert all((m["stderr"] is not None) == shows_answers for m in record["models"])
            assert bool(record["groups"]) == (shows_answers and record["job"] is not None)
            original = board.ids["alpha-test"] if (viewer, submission) in DUPLICATE_SHOWN else None
            assert record["duplicate_of"] == original, (viewer, submission)
    for submission in SUBMISSIONS:  # a signed-in viewer with no team (the web only)
        assert api(board.clients["vic"], f"/submissions/{board.ids[submission]}") is None


@pytest.mark.parametrize("phase", [0, 1], ids=["open", "closed"])
def test_standings_look_the_same_from_the_cli_and_the_api(board: Board, phase: int) -> None:
    if phase:
        board.close()
    for viewer in VIEWERS:
        best = standings_both(board, viewer, "r1", "test", every=False)
        every = standings_both(board, viewer, "r1", "test", every=True)
        assert [r["team"] for r in best] == ["alpha", "beta"]  # public to all
        assert len(every) == 3
        holdout = standings_both(board, viewer, "r1", "holdout", every=False)
        if phase:
            assert [r["team"] for r in holdout] == ["alpha"]
        else:  # organisers see the (still empty) table; teams: not published yet
            assert holdout == ([] if viewer == "organiser" else None)
        draft = standings_both(board, viewer, "r2", "test", every=False)
        assert draft == ([] if viewer == "organiser" else None)
    assert api(board.clients["vic"], "/rounds/r1/standings") is not None


def test_practice_standings_and_the_queue_are_the_organisers(board: Board) -> None:
    assert cli("show", "r1", "--split", "train") is not None
    assert cli("show", "r1", "--split", "train", "--as-team", "alpha") is None
    assert board.clients["alpha"].get("/api/v1/leaderboard/status").status_code == 403
    status = cli("status")
    assert status == board.clients["organiser"].get("/api/v1/leaderboard/status").json() | {
        "checked_at": status["checked_at"]
    }


def test_anonymous_sees_nothing_of_a_private_round(board: Board) -> None:
    anonymous = TestClient(board.app)
    assert anonymous.get(f"/api/v1/leaderboard/submissions/{board.ids['alpha-test']}").status_code == 401
    assert api(anonymous, "/rounds") == {"items": [], "total": 0, "limit": 100, "offset": 0}
    for name in ("r1", "r2", "nope"):  # a private round is not there, as one that does not exist
        refused = anonymous.get(f"/api/v1/leaderboard/rounds/{name}/standings")
        assert (refused.status_code, refused.json()) == (404, {"detail": f"no round named {name!r}"})


@pytest.mark.parametrize("phase", [0, 1], ids=["open", "closed"])
def test_anonymous_sees_a_public_round_as_a_member_of_another_team_does(board: Board, phase: int) -> None:
    """The visitor of a public round is a viewer of no team (``Viewer.anonymous``): the standings of beta's
    member (whose rows of alpha are another team's) and of a signed-in viewer, no more; no submission."""
    with board.app.state.sessions.begin() as session:
        rounds.set_public(session, "r1", True)
        rounds.set_public(session, "r2", True)  # a draft stays the organisers' even when marked public
    if phase:
        board.close()
    anonymous = TestClient(board.app)
    for split in ("test", "holdout"):
        for every in (False, True):
            seen = api(anonymous, "/rounds/r1/standings", split=split, all=every)
            if split == "holdout" and not phase:
                assert seen is None  # published when the round closes
                continue
            as_beta = standings_both(board, "beta", "r1", split, every)
            unnumbered = [{k: v for k, v in row.items() if k != "submission_id"} for row in as_beta]
            assert seen is not None and seen["rows"] == unnumbered  # beta's own rows carry their numbers
            assert seen == api(board.clients["vic"], "/rounds/r1/standings", split=split, all=every)
            exact = ["cross_entropy" in row["metrics"] for row in seen["rows"]]
            assert seen["rows"] and exact == [bool(phase)] * len(exact)  # sealed while open
    assert api(anonymous, "/rounds/r2/standings") is None
    listed = api(anonymous, "/rounds")  # the public open round, not the draft marked public
    assert [r["name"] for r in listed["items"]] == ["r1"] and listed["total"] == 1
    assert listed["items"] == [r for r in api(board.clients["vic"], "/rounds")["items"] if r["name"] == "r1"]
    for submission in SUBMISSIONS:  # no team's submission, job or logs, as for vic
        assert anonymous.get(f"/api/v1/leaderboard/submissions/{board.ids[submission]}").status_code == 401
    with board.app.state.sessions() as session:
        as_views = views.standings_view(session, Viewer.anonymous(), "r1", "test", best=False)
        assert as_views.model_dump(mode="json") == api(anonymous, "/rounds/r1/standings", all=True)
        assert views.team_of(Viewer.anonymous()) is None and not views.is_organiser(Viewer.anonymous())


def test_an_unknown_team_is_a_one_line_error(board: Board) -> None:
    result = CliRunner().invoke(leaderboard_cli, ["results", "1", "--as-team", "nobody"])
    assert "no team named 'nobody'" in str(result.exception)


# --- the same through a real ``python -m assay`` process ------------------------------------------------


def _assay(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "assay", "leaderboard", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow  # subprocesses, 24 s
def test_a_real_cli_process_gives_the_api_answers(board: Board) -> None:
    own, other, copy = (board.ids[name] for name in ("alpha-test", "beta-test", "beta-copy"))
    calls = {
        "organiser copy": ("results", str(copy), "--json"),
        "alpha own": ("results", str(own), "--as-team", "alpha", "--json"),
        "alpha other": ("results", str(other), "--as-team", "alpha", "--json"),
        "alpha holdout": ("show", "r1", "--split", "holdout", "--as-team", "alpha", "--json"),
    }
    with ThreadPoolExecutor(len(calls)) as pool:
        done = dict(zip(calls, pool.map(lambda args: _assay(*args), calls.values()), strict=True))
    assert json.loads(done["organiser copy"].stdout) == api(
        board.clients["organiser"], f"/submissions/{copy}"
    )
    assert json.loads(done["alpha own"].stdout) == api(board.clients["alpha"], f"/submissions/{own}")
    for name, message in (
        ("alpha other", f"no submission {other}"),
        ("alpha holdout", "when the round closes"),
    ):
        refused = done[name]
        assert refused.returncode == 2 and refused.stdout == "", name
        assert len(refused.stderr.strip().splitlines()) == 1 and message in refused.stderr, name
    assert api(board.clients["alpha"], f"/submissions/{other}") is None


# --- the rule's small pieces, and that the faces hold none of it -------------------------------------------


def test_a_team_needs_the_team_member_role() -> None:
    assert views.team_of(Viewer(frozenset({"viewer"}), "alpha")) is None
    assert views.team_of(Viewer(frozenset({"team_member"}), "alpha")) == "alpha"
    assert views.team_of(Viewer(frozenset({"organiser"}), "alpha")) == "alpha"  # organisers hold every role
    with pytest.raises(views.NotAllowed):
        views.submitting_team(Viewer(frozenset({"viewer"}), None))


FACES = ("src/assay/web/routes/leaderboard.py", "src/assay/leaderboard/cli.py")
FORBIDDEN = (
    "select(",  # SQL
    "session.scalar",
    "session.execute",
    ".query(",
    "session.get(",
    "show_logs",  # the sharing rule's inputs
    '"organiser"',
    '"team_member"',
    '"draft"',
)


@pytest.mark.parametrize("face", FACES)
def test_faces_hold_no_query_no_rule_and_no_state_change(face: str) -> None:
    source = (PROJECT / face).read_text(encoding="utf-8")
    found = [word for word in FORBIDDEN if word in source]
    found += re.findall(r"\.status\s*=(?!=)", source)  # a workflow state set by hand
    assert found == [], f"{face} holds {found}: that belongs to assay.leaderboard"
