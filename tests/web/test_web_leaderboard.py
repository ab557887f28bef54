"""The leaderboard on the web: who sees what (teams, holdout, organisers), uploads (limits, unsafe archives,
validation, the window) and the JSON API's edges, on a real app and a real SQLite file per test.

The round is a small fake ``assay zoo split`` folder (4 models per split, empty model files) so these tests
need no zoo; scores come from the real ``score_job`` on model results written straight to the store. The
browser test (``test_web_leaderboard_browser.py``) runs a real detector through a real worker.
"""

from __future__ import annotations

import asyncio
import html
import io
import re
import tarfile
import zipfile
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import select
from starlette.testclient import TestClient

from assay.leaderboard import rounds
from assay.leaderboard.status import queue_status
from assay.store import Job, Submission
from assay.store.models import utcnow
from assay.web import accounts
from assay.web.app import create_app
from assay.web.routes import leaderboard as lb_routes
from assay.web.uploads import bounded_receive
from fake_board import ANSWERS, TRUTH, fake_splits, scored
from web_client import PASSWORD, csrf, signed_in

PROJECT = Path(__file__).resolve().parents[2]
CONSTANT = PROJECT / "detectors" / "constant"


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=3600)
        rounds.set_status(session, "r1", "open")
        alpha, beta = rounds.add_team(session, "alpha"), rounds.add_team(session, "beta")
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
        accounts.create_user(session, "bea", PASSWORD, ["team_member"], team=beta)
        accounts.create_user(session, "vic", PASSWORD, ["viewer"])
    return web


def pack_tar(folder: Path, dest: Path, **extra: bytes) -> Path:
    """``folder`` as a .tar.gz with one top folder, plus ``extra`` members (name -> bytes) at the top."""
    with tarfile.open(dest, "w:gz") as archive:
        archive.add(folder, arcname="detector", filter=lambda m: None if "__pycache__" in m.name else m)
        for name, data in extra.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return dest


def upload(client: TestClient, archive: Path, split: str = "test", token: str | None = None):  # type: ignore[no-untyped-def]
    token = token or csrf(client, "/leaderboard/rounds/r1/submit")
    with archive.open("rb") as handle:
        return client.post(
            "/leaderboard/rounds/r1/submit",
            data={"csrf_token": token, "split": split},
            files={"archive": (archive.name, handle, "application/octet-stream")},
            follow_redirects=False,
        )


def count_submissions(app: FastAPI) -> int:
    with app.state.sessions() as session:
        return len(session.scalars(select(Submission)).all())


# --- access --------------------------------------------------------------------------------------------


def test_anonymous_pages_redirect_and_api_gives_401(app: FastAPI) -> None:
    """r1 is private: to a visitor it does not exist (public rounds: test_web_leaderboard_public.py)."""
    client = TestClient(app)
    assert client.get("/leaderboard/rounds/r1", follow_redirects=False).status_code == 404
    assert client.get("/api/v1/leaderboard/rounds/r1/standings").status_code == 404
    page = client.get("/leaderboard/rounds/r1/submit", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
    listing = client.get("/api/v1/leaderboard/rounds")  # public rounds only: none
    assert (listing.status_code, listing.json()["items"], listing.json()["total"]) == (200, [], 0)
    for path in ("/submissions/1", "/jobs/1", "/status"):
        response = client.get(f"/api/v1/leaderboard{path}")
        assert response.status_code == 401, path
    posted = client.post("/api/v1/leaderboard/rounds/r1/submissions", files={"archive": ("a.zip", b"x")})
    assert posted.status_code == 401 and count_submissions(app) == 0


def test_standings_are_public_aggregates_and_submissions_stay_with_their_team(app: FastAPI) -> None:
    alpha_test = scored(app.state.sessions, "alpha", "test", ANSWERS)
    beta_test = scored(app.state.sessions, "beta", "test", dict.fromkeys(TRUTH, 0.5))
    job_id = app.state.sessions().get(Submission, alpha_test).job.id
    bea, vic, tom = signed_in(app, "bea"), signed_in(app, "vic"), signed_in(app, "tom")

    standings = vic.get("/api/v1/leaderboard/rounds/r1/standings").json()
    assert [r["team"] for r in standings["rows"]] == ["alpha", "beta"]  # alpha's answers beat 0.5
    # no submission number: vic may open neither row (issue 47)
    assert set(standings["rows"][0]) == {
        "rank", "team", "technique", "submitted_at", "status", "metrics", "flagged_models", "tied_with",
        "summary",
    }  # fmt: skip
    page = bea.get("/leaderboard/rounds/r1").text
    assert "alpha-technique" in page and f"/leaderboard/submissions/{alpha_test}" not in page
    assert f"/leaderboard/submissions/{beta_test}" in page  # bea's own row links to its page

    for path in (f"/submissions/{alpha_test}", f"/submissions/{alpha_test}/logs", f"/jobs/{job_id}"):
        assert bea.get(f"/leaderboard{path}").status_code == 404, path
        assert vic.get(f"/leaderboard{path}").status_code == 404, path
        assert tom.get(f"/leaderboard{path}").status_code == 200, path
    for path in (f"/submissions/{alpha_test}", f"/jobs/{job_id}"):
        assert bea.get(f"/api/v1/leaderboard{path}").status_code == 404, path
        assert tom.get(f"/api/v1/leaderboard{path}").status_code == 200, path
    assert "stderr of alpha" not in bea.get(f"/leaderboard/submissions/{alpha_test}/logs").text
    assert signed_in(app, "olga").get(f"/api/v1/leaderboard/submissions/{alpha_test}").status_code == 200


def test_the_standings_page_costs_the_same_statements_for_2_or_8_finished_jobs(app: FastAPI) -> None:
    """The page a crowd's viewers reload: a statement per job (its team, metrics, results) made it the
    heaviest route of the crowd benchmark (issue 27)."""
    from sqlalchemy import event

    vic = signed_in(app, "vic")
    statements: list[str] = []
    event.listen(app.state.sessions.kw["bind"], "before_cursor_execute", lambda *a: statements.append(a[2]))

    def cost() -> int:
        statements.clear()
        for path in ("/leaderboard/rounds/r1", "/api/v1/leaderboard/rounds/r1/standings"):
            assert vic.get(path).status_code == 200
        return len(statements)

    for team in ("alpha", "beta"):
        scored(app.state.sessions, team, "test", ANSWERS)
    vic.get("/leaderboard/rounds/r1")  # the session's first use is written down once: not counted
    few = cost()
    for n in range(6):
        scored(app.state.sessions, ("alpha", "beta")[n % 2], "test", dict.fromkeys(TRUTH, n / 6), ago_h=n)
    assert cost() == few, statements


def test_per_model_detail_follows_the_split(app: FastAPI) -> None:
    test_id = scored(app.state.sessions, "alpha", "test", ANSWERS)
    train_id = scored(app.state.sessions, "alpha", "train", ANSWERS)
    tom, olga = signed_in(app, "tom"), signed_in(app, "olga")

    on_test = tom.get(f"/api/v1/leaderboard/submissions/{test_id}").json()
    assert on_test["detail"] == "errors" and on_test["groups"] == {} and on_test["sealed"]
    # while the round is open: the disclosed score only (test_leaderboard_leak counts what it reveals)
    assert (
        all(name.startswith("shown_") for name in on_test["metrics"]) and "roc_auc" not in on_test["metrics"]
    )
    assert on_test["models"] == [] and on_test["flag_counts"] == {}  # issue 44: flags wait for the close
    page = tom.get(f"/leaderboard/submissions/{test_id}").text
    assert 'id="sealed"' in page and "<svg" not in page and "0.9000" not in page and "id-0000" not in page
    logs = tom.get(f"/leaderboard/submissions/{test_id}/logs").text
    assert "isolation: bubblewrap" not in logs and "shown when the round closes" in logs  # issue 44
    assert "stderr of" not in logs and "not shared" in logs

    on_train = tom.get(f"/api/v1/leaderboard/submissions/{train_id}").json()
    assert on_train["detail"] == "full" and set(on_train["groups"]) == {"architecture"}
    assert {m["model"]: (m["answer"], m["truth"]) for m in on_train["models"]} == {
        name: (ANSWERS[name], TRUTH[name]) for name in TRUTH
    }
    assert "stderr of alpha on id-00000001" in tom.get(f"/leaderboard/submissions/{train_id}/logs").text

    as_organiser = olga.get(f"/api/v1/leaderboard/submissions/{test_id}").json()
    assert as_organiser["detail"] == "full" and as_organiser["models"][1]["answer"] == 0.9


def test_holdout_is_hidden_until_the_round_closes(app: FastAPI) -> None:
    scored(app.state.sessions, "alpha", "test", ANSWERS)
    holdout_id = scored(app.state.sessions, "alpha", "holdout", ANSWERS)
    tom, vic, olga = signed_in(app, "tom"), signed_in(app, "vic"), signed_in(app, "olga")

    hidden = vic.get("/api/v1/leaderboard/rounds/r1/standings", params={"split": "holdout"})
    assert hidden.status_code == 404 and "when the round closes" in hidden.json()["detail"]
    page = vic.get("/leaderboard/rounds/r1").text
    assert 'id="holdout-hidden"' in page and 'id="holdout-best"' not in page
    assert tom.get(f"/leaderboard/submissions/{holdout_id}").status_code == 404  # even the team's own
    assert tom.get(f"/api/v1/leaderboard/submissions/{holdout_id}").status_code == 404
    organiser_view = olga.get("/api/v1/leaderboard/rounds/r1/standings", params={"split": "holdout"})
    assert organiser_view.status_code == 200

    with app.state.sessions.begin() as session:
        rounds.set_status(session, "r1", "closed")
    shown = vic.get("/api/v1/leaderboard/rounds/r1/standings", params={"split": "holdout"}).json()
    assert [r["team"] for r in shown["rows"]] == ["alpha"]
    page = vic.get("/leaderboard/rounds/r1").text
    assert 'id="holdout-best"' in page and 'id="holdout-hidden"' not in page
    record = tom.get(f"/api/v1/leaderboard/submissions/{holdout_id}").json()
    assert (
        record["detail"] == "aggregate" and record["models"] == [] and record["metrics"]["cross_entropy"] > 0
    )


def test_draft_rounds_are_for_organisers_only(app: FastAPI, tmp_path: Path) -> None:
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "r2", tmp_path / "splits")
    vic, olga = signed_in(app, "vic"), signed_in(app, "olga")
    assert [r["name"] for r in vic.get("/api/v1/leaderboard/rounds").json()["items"]] == ["r1"]
    assert vic.get("/leaderboard/rounds/r2").status_code == 404
    assert vic.get("/api/v1/leaderboard/rounds/r2/standings").status_code == 404
    assert [r["name"] for r in olga.get("/api/v1/leaderboard/rounds").json()["items"]] == ["r2", "r1"]
    assert olga.get("/leaderboard/rounds/r2").status_code == 200


def test_status_is_for_organisers_and_flags_stale_workers(app: FastAPI) -> None:
    sessions = app.state.sessions
    with sessions.begin() as session:
        round_ = rounds.get_round(session, "r1")
        test = rounds.get_split(round_, "test")
        alpha, beta = (rounds.get_team(session, t) for t in ("alpha", "beta"))
        old = utcnow() - timedelta(minutes=10)
        for team, status, beat in (
            (alpha, "running", utcnow()),
            (beta, "running", old),
            (alpha, "queued", None),
        ):
            sub = Submission(team=team, split=test, artifact_path="x", artifact_sha256="s", status=status)
            session.add(
                Job(submission=sub, status=status, worker="host:1", heartbeat_at=beat, claimed_at=beat)
            )
    with sessions() as session:
        state = queue_status(session)
    assert (state.queued, state.running, state.stale) == (1, 2, 1)
    assert [(j.team, j.stale, j.models_total) for j in state.running_jobs] == [
        ("alpha", False, 4),
        ("beta", True, 4),
    ]
    assert state.rounds[0].name == "r1" and state.rounds[0].jobs == {"running": 2, "queued": 1}

    for username in ("vic", "tom"):
        client = signed_in(app, username)
        assert client.get("/leaderboard/status").status_code == 403
        assert client.get("/api/v1/leaderboard/status").status_code == 403
    olga = signed_in(app, "olga")
    page = olga.get("/leaderboard/status")
    assert page.status_code == 200 and '<strong id="stale-count">1</strong>' in page.text
    assert page.text.count('<tr class="stale">') == 1
    assert olga.get("/api/v1/leaderboard/status").json()["queued"] == 1


# --- uploads -------------------------------------------------------------------------------------------


def test_upload_queues_a_job_then_the_window_holds(app: FastAPI, tmp_path: Path) -> None:
    tom = signed_in(app, "tom")
    form = tom.get("/leaderboard/rounds/r1/submit").text
    assert 'enctype="multipart/form-data"' in form and "can submit to the test split now" in form

    response = upload(tom, pack_tar(CONSTANT, tmp_path / "constant.tar.gz"))
    assert response.status_code == 303, response.text
    job_url = response.headers["location"]
    assert re.fullmatch(r"/leaderboard/jobs/\d+", job_url)
    with app.state.sessions() as session:
        made = session.scalars(select(Submission)).one()
        assert (made.status, made.team.name, made.split.name, made.technique) == (
            "queued",
            "alpha",
            "test",
            "constant",
        )
        assert made.job is not None and made.job.status == "queued"
        assert (Path(made.artifact_path) / "entrypoint.py").is_file()
    job_page = tom.get(job_url).text
    assert 'data-progress-url="/api/v1/leaderboard/jobs/' in job_page and ">Refresh</a>" in job_page
    progress = tom.get(f"/api/v1/leaderboard{job_url.removeprefix('/leaderboard')}").json()
    # a test job of an open round: no count of models done for its team (issue 35)
    assert (progress["models_done"], progress["models_total"], progress["finished"]) == (None, 4, False)

    again = upload(tom, pack_tar(CONSTANT, tmp_path / "again.tar.gz", **{"detector/NOTE.txt": b"v2"}))
    assert again.status_code == 400 and "window for this split reopens at" in again.text
    assert "does not use up your team" in again.text
    for page in ("/leaderboard/rounds/r1/submit", "/leaderboard/rounds/r1"):
        assert "submission is allowed from" in tom.get(page).text
    smoke = upload(tom, pack_tar(CONSTANT, tmp_path / "smoke.tar.gz"), split="smoke")
    assert smoke.status_code == 303  # smoke runs have no window
    with app.state.sessions() as session:
        statuses = [s.status for s in session.scalars(select(Submission).order_by(Submission.id))]
    assert statuses == ["queued", "rejected", "queued"]


def test_validation_errors_are_shown_on_the_form(app: FastAPI, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "entrypoint.py").write_text("print('hi')\n")
    (broken / "metaparameters.json").write_text("{}")
    response = upload(signed_in(app, "tom"), pack_tar(broken, tmp_path / "broken.tar.gz"))
    assert response.status_code == 400
    assert "metaparameters_schema.json: missing from the submission" in response.text
    assert 'id="upload-form"' in response.text  # the form is there to try again


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("evil.tar.gz", "tar", "member '../../escape.py' would be written outside the folder"),
        ("evil.zip", "zip", "member '../escape.py' would be written outside the folder"),
        ("detector.sif", "bytes", "as a .tar.gz, .tgz, .tar or .zip archive"),
        ("corrupt.tar.gz", "bytes", "not a folder, .tar(.gz) or .zip"),
        ("corrupt.zip", "badzip", "cannot unpack this archive"),
    ],
)
def test_unsafe_or_unreadable_archives_are_refused(
    app: FastAPI, tmp_path: Path, assay_home: Path, name: str, content: str, message: str
) -> None:
    archive = tmp_path / name
    if content == "tar":
        pack_tar(CONSTANT, archive, **{"../../escape.py": b"print('out')"})
    elif content == "zip":
        with zipfile.ZipFile(archive, "w") as packed:
            packed.writestr("../escape.py", "print('out')")
    elif content == "badzip":  # a real zip whose member's bytes were damaged after packing
        with zipfile.ZipFile(archive, "w") as packed:
            packed.writestr("entrypoint.py", "print('x')" * 50)
        data = bytearray(archive.read_bytes())
        data[40:60] = b"\xff" * 20
        archive.write_bytes(bytes(data))
    else:
        archive.write_bytes(b"\x1f\x8b not really gzip " * 20)
    response = upload(signed_in(app, "tom"), archive)
    assert response.status_code == 400 and message in html.unescape(response.text)
    assert name in response.text and str(assay_home) not in response.text  # names the upload, not our disk
    assert not list(tmp_path.rglob("escape.py")) and not list(assay_home.rglob("escape.py"))
    assert count_submissions(app) == 0


def _member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    return info


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("/escape.py", b"print('out')")], "member '/escape.py' is an absolute path"),
        (  # link then write: a link, then a file of the same name written through it
            [("detector/escape.py", b"", tarfile.SYMTYPE, "entrypoint.py"), ("detector/escape.py", b"x")],
            "member 'detector/escape.py' is a link to 'entrypoint.py'; submit regular files only",
        ),
        (  # a folder, then a file of the same name: tarfile raised IsADirectoryError
            [("detector/escape.py", b"", tarfile.DIRTYPE), ("detector/escape.py", b"x")],
            "member 'detector/escape.py' appears twice in the archive",
        ),
        ([("detector/entrypoint.py", b"again")], "member 'detector/entrypoint.py' appears twice"),
        (
            [("detector/escape.py", b"x"), ("detector/escape.py/inner.py", b"y")],
            "member 'detector/escape.py/inner.py' lies under 'detector/escape.py', which is a file",
        ),
        ([("detector/fifo", b"", tarfile.FIFOTYPE)], "member 'detector/fifo' is a device, pipe or socket"),
    ],
    ids=["absolute", "link-then-write", "dir-then-file", "twice", "under-a-file", "fifo"],
)
def test_unsafe_tar_members_are_refused_by_name_and_reason(
    app: FastAPI, tmp_path: Path, assay_home: Path, members: list[tuple], message: str
) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as packed:
        packed.add(CONSTANT, arcname="detector", filter=lambda m: None if "__pycache__" in m.name else m)
        for name, data, *rest in members:
            packed.addfile(_member(name, data, *rest), io.BytesIO(data))
    response = upload(signed_in(app, "tom"), archive)
    assert response.status_code == 400 and f"evil.tar: {message}" in html.unescape(response.text)
    assert "Error" not in response.text  # no internal exception's name
    assert not list(assay_home.rglob("escape.py*")) and count_submissions(app) == 0


def test_too_large_uploads_are_refused_with_a_clear_message(
    app: FastAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lb_routes, "MAX_UPLOAD_BYTES", 4096)
    monkeypatch.setattr(lb_routes, "FORM_OVERHEAD", 4096)
    tom = signed_in(app, "tom")
    token = csrf(tom, "/leaderboard/rounds/r1/submit")
    slightly = tmp_path / "slightly.tar.gz"
    slightly.write_bytes(b"x" * 6000)  # within the body allowance: caught when the file is copied
    response = upload(tom, slightly, token=token)
    assert response.status_code == 413 and "larger than the limit of" in response.text
    assert 'id="upload-form"' in response.text
    far = tmp_path / "far.tar.gz"
    far.write_bytes(b"x" * 200_000)  # the declared length alone is over: refused before it is read
    response = upload(tom, far, token=token)
    assert response.status_code == 413 and "larger than the limit" in response.text
    api = tom.post(
        "/api/v1/leaderboard/rounds/r1/submissions",
        files={"archive": ("far.tar.gz", b"x" * 200_000)},
        headers={"X-CSRF-Token": token},
    )
    assert api.status_code == 413 and "larger than the limit" in api.json()["detail"]
    assert count_submissions(app) == 0


def test_a_declared_oversize_body_is_refused_before_a_byte_is_read() -> None:
    async def receive() -> dict:
        raise AssertionError("the body was read")

    limit = lb_routes.MAX_UPLOAD_BYTES + lb_routes.FORM_OVERHEAD
    receive_bounded = bounded_receive(receive, str(limit + 1), limit, lb_routes.UploadTooLarge)
    with pytest.raises(lb_routes.UploadTooLarge):
        asyncio.run(receive_bounded())


def test_only_team_members_may_upload(app: FastAPI, tmp_path: Path) -> None:
    archive = pack_tar(CONSTANT, tmp_path / "constant.tar.gz")
    for username in ("vic", "olga"):  # a viewer, and an organiser who belongs to no team
        client = signed_in(app, username)
        assert client.get("/leaderboard/rounds/r1/submit").status_code == 403
        assert upload(client, archive, token=csrf(client)).status_code == 403
        api = client.post(
            "/api/v1/leaderboard/rounds/r1/submissions",
            files={"archive": (archive.name, archive.read_bytes())},
            headers={"X-CSRF-Token": csrf(client)},
        )
        assert api.status_code == 403
    tom = signed_in(app, "tom")
    assert upload(tom, archive, token="forged").status_code == 403  # CSRF
    assert count_submissions(app) == 0


# --- the JSON API --------------------------------------------------------------------------------------


def test_api_submit_with_a_token_and_bad_input_never_500s(app: FastAPI, tmp_path: Path) -> None:
    with app.state.sessions.begin() as session:
        token = accounts.create_api_token(session, accounts.get_user(session, "tom"), "ci")  # type: ignore[arg-type]
    client = TestClient(app, headers={"Authorization": f"Bearer {token}"})
    archive = pack_tar(CONSTANT, tmp_path / "constant.tar.gz").read_bytes()
    made = client.post(
        "/api/v1/leaderboard/rounds/r1/submissions",
        data={"split": "smoke"},
        files={"archive": ("constant.tar.gz", archive)},
    )
    assert made.status_code == 201 and made.json()["status"] == "queued" and made.json()["split"] == "smoke"
    assert made.json()["job"]["models_total"] == 4  # smoke: the first 4 training models
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README").write_text("nothing here")
    rejected = client.post(
        "/api/v1/leaderboard/rounds/r1/submissions",
        files={"archive": ("empty.tar.gz", pack_tar(empty, tmp_path / "empty.tar.gz").read_bytes())},
    )
    assert rejected.status_code == 400 and "entrypoint.py: missing" in rejected.json()["detail"]
    assert count_submissions(app) == 2  # the rejection is on record

    for path, code in [
        ("/submissions/0", 422),
        ("/submissions/-3", 422),
        ("/submissions/99999999999999999999", 422),
        ("/submissions/abc", 422),
        ("/submissions/424242", 404),
        ("/jobs/2147483648", 422),
        ("/rounds/" + "x" * 101 + "/standings", 422),
        ("/rounds/nope/standings", 404),
        ("/rounds/r%001/standings", 422),
        ("/rounds/r1/standings?split=train", 422),
        ("/rounds/r1/standings?all=maybe", 422),
        ("/rounds/r1/standings?split=test&all=true", 200),
    ]:
        assert client.get(f"/api/v1/leaderboard{path}").status_code == code, path
    bad_split = client.post(
        "/api/v1/leaderboard/rounds/r1/submissions",
        data={"split": "holdout"},
        files={"archive": ("constant.tar.gz", archive)},
    )
    assert bad_split.status_code == 422
    no_file = client.post("/api/v1/leaderboard/rounds/r1/submissions", data={"archive": "text"})
    assert no_file.status_code == 422
    assert (
        client.post(
            "/api/v1/leaderboard/rounds/nope/submissions", files={"archive": ("a.zip", b"")}
        ).status_code
        == 404
    )

    schema = client.get("/api/v1/openapi.json").json()
    submit = schema["paths"]["/api/v1/leaderboard/rounds/{name}/submissions"]["post"]
    assert submit["tags"] == ["leaderboard"] and "multipart/form-data" in submit["requestBody"]["content"]
    assert {"201", "400", "403", "404", "413", "422"} <= set(submit["responses"])
    assert not any(p.startswith("/leaderboard") for p in schema["paths"])  # pages stay out of the API doc


def test_round_list_and_nav(app: FastAPI) -> None:
    vic = signed_in(app, "vic")
    rounds_page = vic.get("/leaderboard").text
    assert 'href="/leaderboard/rounds/r1"' in rounds_page and "/leaderboard/status" not in rounds_page
    assert 'href="/leaderboard"' in rounds_page  # the nav area is there for a viewer
    listed = vic.get("/api/v1/leaderboard/rounds").json()["items"]
    assert listed[0]["name"] == "r1" and listed[0]["status"] == "open"
    assert listed[0]["splits"] == ["train", "test", "holdout", "smoke"]
    assert "/leaderboard/status" in signed_in(app, "olga").get("/leaderboard").text


def post_settings(client: TestClient, **form: str) -> int:
    """The round page's settings form, posted as ``client`` with its CSRF token; the answer's status."""
    sent = client.post("/leaderboard/rounds/r1/settings", data={**form, "csrf_token": csrf(client)})
    return sent.history[0].status_code if sent.history else sent.status_code


def test_the_plateau_rule_is_the_organisers_and_goes_to_the_audit_trail(app: FastAPI) -> None:
    from assay.store.web_models import WebAuditEvent

    olga, tom = signed_in(app, "olga"), signed_in(app, "tom")
    form = {"plateau_delta": "0.005", "plateau_days": "7"}
    page = olga.get("/leaderboard/rounds/r1").text
    assert 'id="round-settings"' in page and "less than 0.01 over 14 d" in page
    assert 'id="round-settings"' not in tom.get("/leaderboard/rounds/r1").text
    assert post_settings(tom, **form) == 403
    assert post_settings(olga, **{**form, "plateau_days": "0"}) == 422
    assert post_settings(olga, **form) == 303
    assert "less than 0.005 over 7 d" in olga.get("/leaderboard/rounds/r1").text
    with app.state.sessions() as session:
        round_ = rounds.get_round(session, "r1")
        assert (round_.plateau_delta, round_.plateau_days) == (0.005, 7.0)
        events = session.scalars(select(WebAuditEvent).where(WebAuditEvent.action == "round.settings")).all()
        assert [(e.actor.username, e.target, e.detail) for e in events] == [
            ("olga", "round r1", "plateau_delta 0.01 -> 0.005; plateau_days 14 -> 7")
        ]
    assert "round settings changed" in olga.get("/admin/audit").text


def test_the_publication_clock_is_the_organisers_and_goes_to_the_audit_trail(app: FastAPI) -> None:
    """Issue 44: sealed results are published on the round's clock, which the organiser sets (every hour
    on the hour unless changed), on the page's form as on the command line; every team reads it."""
    from assay.store.web_models import WebAuditEvent

    olga, tom = signed_in(app, "olga"), signed_in(app, "tom")
    assert "published every hour on the hour" in tom.get("/leaderboard/rounds/r1").text
    form = {"plateau_delta": "0.01", "plateau_days": "14", "publish_every_s": "600"}
    assert post_settings(olga, **{**form, "publish_every_s": "0"}) == 422
    assert post_settings(olga, **form) == 303
    assert "published every 10 minutes" in tom.get("/leaderboard/rounds/r1").text
    assert tom.get("/api/v1/leaderboard/rounds").json()["items"][0]["publish_every_s"] == 600
    with app.state.sessions() as session:
        events = session.scalars(select(WebAuditEvent).where(WebAuditEvent.action == "round.settings")).all()
        assert [(e.actor.username, e.detail) for e in events] == [("olga", "publish_every_s 3600 -> 600")]


def test_the_plateau_rule_from_the_command_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "ASSAY_DB_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    command = [sys.executable, "-m", "assay", "leaderboard"]
    run = lambda *args: subprocess.run([*command, *args], capture_output=True, text=True, env=env)  # noqa: E731
    assert run("round", "create", "r1", "--dataset", str(fake_splits(tmp_path / "splits"))).returncode == 0
    changed = run("round", "set", "r1", "--plateau-days", "3")
    assert changed.returncode == 0 and "plateau_days 14 -> 3" in changed.stdout
    refused = run("round", "set", "r1", "--plateau-delta", "-1")
    assert refused.returncode == 2 and "--plateau-delta: -1.0 must be a finite number >= 0" in refused.stderr


# --- the pages as a performer meets them (issue 39, item 4) ----------------------------------------------


def queued(app: FastAPI, team: str, split: str, status: str = "queued") -> tuple[int, int]:
    """A submission of ``team`` on ``split`` whose job is ``status`` with no result yet: (submission, job)."""
    with app.state.sessions.begin() as session:
        sub = Submission(
            team=rounds.get_team(session, team),
            split=rounds.get_split(rounds.get_round(session, "r1"), split),
            artifact_path="/nowhere",
            artifact_sha256=f"{team}-{split}-{status}",
            technique="waiting",
            status=status,
        )
        job = Job(submission=sub, status=status)
        session.add(job)
        session.flush()
        return sub.id, job.id


def test_a_queued_submission_says_in_words_when_its_results_come(app: FastAPI) -> None:
    """Before: a queued train submission showed the per-model table's header over no rows, and a queued test
    submission the flag table's; now neither table exists until there is something in it."""
    tom = signed_in(app, "tom")
    train, _ = queued(app, "alpha", "train")
    test, _ = queued(app, "alpha", "test")
    pending = {
        train: 'id="models-pending">The job is queued: results per model appear here when it runs',
        test: 'id="models-pending">Sealed: nothing of this job shows until its results are published',  # 44
    }
    for sub_id, words in pending.items():
        page = tom.get(f"/leaderboard/submissions/{sub_id}").text
        assert 'id="models"' not in page and 'id="flag-counts"' not in page
        assert words in page
    round_page = signed_in(app, "bea").get("/leaderboard/rounds/r1").text  # beta has submitted nothing
    assert 'id="no-submissions"' in round_page and 'id="test-best-empty"' in round_page
    assert 'class="submissions"' not in round_page and 'id="test-best"' not in round_page


def test_a_running_sealed_test_job_shows_no_flag_counts_until_it_finishes(app: FastAPI) -> None:
    """Flag counts that grew as results arrived summed to the count of models done, which the job page keeps
    back while the round is open (``_hides_progress``); the organiser still sees them."""
    from assay.store import ModelResult

    sub_id, job_id = queued(app, "alpha", "test", status="running")
    tom, olga = signed_in(app, "tom"), signed_in(app, "olga")
    seen, pages = set(), set()
    for name in TRUTH:
        with app.state.sessions.begin() as session:
            session.add(ModelResult(job_id=job_id, model_name=name, value=0.5, flags="", wall_seconds=1.0))
        record = tom.get(f"/api/v1/leaderboard/submissions/{sub_id}").json()
        seen.add(str(record["flag_counts"]))
        pages.add(tom.get(f"/leaderboard/submissions/{sub_id}").text.split("<main", 1)[-1])
    assert seen == {"{}"} and len(pages) == 1
    assert "nothing of this job shows until its results are published" in pages.pop()  # issue 44
    assert olga.get(f"/api/v1/leaderboard/submissions/{sub_id}").json()["flag_counts"] == {"": len(TRUTH)}


def test_train_results_name_the_clean_group(app: FastAPI, tmp_path: Path) -> None:
    """Before: the per-factor table began with a blank label (the zoo leaves trigger facts empty for clean
    models); the API keeps the raw value."""
    kinds = {"id-00000000": "", "id-00000001": "blend", "id-00000002": "", "id-00000003": "blend"}
    (tmp_path / "splits" / "train" / "METADATA.csv").write_text(
        "model_name,trigger_kind,poisoned\n"
        + "\n".join(f"{name},{kinds[name]},{truth}" for name, truth in TRUTH.items())
    )
    train_id = scored(app.state.sessions, "alpha", "train", ANSWERS)
    page = signed_in(app, "tom").get(f"/leaderboard/submissions/{train_id}").text
    groups = re.search(r"<caption>By trigger_kind</caption>.*?</table>", page, re.S)
    assert groups is not None
    labels = re.findall(r"<tr><td>([^<]*)</td>", groups.group(0))
    assert labels == ["clean (no trigger)", "blend"]  # the blank value sorts first, now with a name
    record = signed_in(app, "tom").get(f"/api/v1/leaderboard/submissions/{train_id}").json()
    assert set(record["groups"]["trigger_kind"]) == {"", "blend"}


def test_the_truth_reads_trojaned_or_clean(app: FastAPI) -> None:
    """Before: the per-model "Truth" column read 1 and 0; the API keeps the 0/1 of the round's files."""
    train_id = scored(app.state.sessions, "alpha", "train", ANSWERS)
    tom = signed_in(app, "tom")
    page = tom.get(f"/leaderboard/submissions/{train_id}").text
    models = re.search(r'<table class="models" id="models">.*?</table>', page, re.S)
    assert models is not None
    truths = re.findall(r'<td class="num">[0-9.]+</td>\s*<td[^>]*>(\w+)</td>', models.group(0))
    assert truths == ["clean" if TRUTH[name] == 0 else "trojaned" for name in sorted(TRUTH)]
    record = tom.get(f"/api/v1/leaderboard/submissions/{train_id}").json()
    assert [m["truth"] for m in record["models"]] == [TRUTH[name] for name in sorted(TRUTH)]


def test_group_names_for_blank_factors() -> None:
    from assay.leaderboard.views import group_name

    assert group_name("trigger_kind", "", {"n": 2, "positives": 0}) == "clean (no trigger)"
    assert group_name("source_class", "", {"n": 3, "positives": 1}) == "none (blank in METADATA)"
    assert group_name("architecture", "cnn", {"n": 2, "positives": 1}) == "cnn"
    cross = "architecture*trigger_kind"
    assert group_name(cross, "[architecture=cnn][trigger_kind=]", {"positives": 0}) == (
        "[architecture=cnn][trigger_kind=clean]"
    )
    assert group_name(cross, "[architecture=][trigger_kind=x]", {"positives": 2}) == (
        "[architecture=none][trigger_kind=x]"
    )


def test_the_roc_curve_has_ticks_and_axis_labels(app: FastAPI) -> None:
    """Before: a bare square with the curve in it; now both axes carry 0, 0.25, 0.5, 0.75, 1 and a title,
    drawn by the server as static SVG (no style attribute, no script: the CSP holds)."""
    train_id = scored(app.state.sessions, "alpha", "train", ANSWERS)
    page = signed_in(app, "tom").get(f"/leaderboard/submissions/{train_id}").text
    svg = re.search(r'<figure class="roc">\s*(<svg.*?</svg>)', page, re.S)
    assert svg is not None
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg.group(1))
    for tick in ("0", "0.25", "0.5", "0.75", "1"):
        assert texts.count(tick) == 2, (tick, texts)  # once per axis
    assert "false positive rate" in texts and "true positive rate" in texts
    assert "style" not in svg.group(1) and "<script" not in svg.group(1) and "on" + "load" not in svg.group(1)


def test_durations_read_in_sensible_units(app: FastAPI) -> None:
    """Before: a run of 0.01 s read "0.01" and one of 250 s "250.00" (under "Seconds"), the logs "0.25 s",
    the status page "(600 s ago)"; now one helper (``assay.durations``) words them all."""
    from assay.store import ModelResult

    train_id = scored(app.state.sessions, "alpha", "train", ANSWERS)
    with app.state.sessions.begin() as session:
        results = session.scalars(select(ModelResult).order_by(ModelResult.model_name)).all()
        for result, seconds in zip(results, (0.01, 2.34, 250.0, 3900.0), strict=True):
            result.wall_seconds = seconds
    tom = signed_in(app, "tom")
    page = tom.get(f"/leaderboard/submissions/{train_id}").text
    models = re.search(r'<table class="models" id="models">.*?</table>', page, re.S)
    assert models is not None
    times = re.findall(r'<td class="num">([^<]*)</td>\s*</tr>', models.group(0))
    assert times == ["under 0.1 s", "2.3 s", "4 min 10 s", "1 h 5 min"]
    logs = tom.get(f"/leaderboard/submissions/{train_id}/logs").text
    assert "exit code 0, 4 min 10 s" in logs and "exit code 0, under 0.1 s" in logs

    with app.state.sessions.begin() as session:
        sub = Submission(
            team=rounds.get_team(session, "beta"),
            split=rounds.get_split(rounds.get_round(session, "r1"), "test"),
            artifact_path="x",
            artifact_sha256="s",
            status="running",
        )
        beat = utcnow() - timedelta(minutes=10)
        session.add(
            Job(submission=sub, status="running", worker="host:1", heartbeat_at=beat, claimed_at=beat)
        )
    status = signed_in(app, "olga").get("/leaderboard/status").text
    assert re.search(r"\(10 min( \d+ s)? ago\)", status) and "1 min is stale" in status
