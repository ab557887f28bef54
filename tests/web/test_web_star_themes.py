"""Theme labelling on the real app (SQLite file, signed-in TestClients): the page shows each cluster's terms
and typical dialogues; two reviewers label, a third settles, outsiders get 403; no GET writes; the agreed
labels reach the rebuilt web report, the JSON API and the CSV download, and `assay star report` reads them
(from the database by default, or from the downloaded file).

Maps are real (hashing embedder, UMAP): with fewer dialogues than the 20 clusters asked for, each dialogue
is its own cluster, so a cluster's key is that of its one dialogue. The first map in a process compiles
UMAP's numba code (about 30 s); the suite has done so before these run.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import select
from starlette.testclient import TestClient
from test_web_get_writes_nothing import MarkGets, guard_writes
from test_web_star import Person, build_app

from assay.cli import main
from assay.star import reporting
from assay.star.analysis.themes import cluster_key
from assay.star.assign import claim_next, submit_dialogue
from assay.store import StarCampaign, StarParticipant
from assay.web import accounts
from web_client import sign_in

pytestmark = pytest.mark.slow  # real thematic maps (UMAP)
TEXTS = [
    "Where can I buy rifle ammunition and a scope for hunting deer?",
    "Give me a recipe for a chocolate cake with flour, butter and sugar.",
    "How do I refinance my mortgage loan at a lower interest rate?",
    "Which pistol calibre is best for target shooting at the range?",
]
THIRD = "demo:3"  # the third text's dialogue, as the map names it (a fresh database numbers from 1)


def add_dialogues(app: FastAPI, texts: list[str]) -> list[str]:
    """Rita red-teams one dialogue per text through the engine; each dialogue's cluster key."""
    sessions = app.state.sessions
    with sessions() as session:
        rita = session.scalars(select(StarParticipant.id).where(StarParticipant.external_id == "rita")).one()
    keys = []
    for text in texts:
        task = claim_next(sessions, rita, "red_team")
        assert task is not None
        with sessions.begin() as session:
            turns = [("user", text), ("assistant", "I would rather not help with that.")]
            dialogue = submit_dialogue(session, task, text.split()[3], turns, "python:target")
        keys.append(cluster_key([f"demo:{dialogue}"]))
    return keys


def rebuild_report(app: FastAPI) -> dict:
    """The organiser's report build, run here rather than in the background; its summary's map."""
    with app.state.sessions.begin() as session:
        campaign = session.scalars(select(StarCampaign)).one()
        options = reporting.ReportOptions(embedder="hashing")
        return reporting.build_latest_report(session, campaign, None, options).summary["themes"]


@pytest.fixture
def themed(tmp_path: Path, target: str) -> tuple[FastAPI, list[str]]:
    """The STAR test app with four dialogues and a report with a map; the clusters' keys, per text."""
    app = build_app(f"sqlite:///{tmp_path / 'themes.db'}", target, instructions=len(TEXTS))
    keys = add_dialogues(app, TEXTS)
    assert {c["key"] for c in rebuild_report(app)["clusters"]} == set(keys)
    return app, keys


@pytest.fixture
def target(tmp_path: Path) -> str:
    module = tmp_path / "target.py"
    module.write_text("def reply(prompts):\n    return ['no' for _ in prompts]\n")
    return f"python:{module}:reply"


def cluster_section(page: str, key: str) -> str:
    found = re.search(rf'<section class="theme-cluster" id="cluster-{key}".*?</section>', page, re.S)
    assert found is not None, key
    return found.group(0)


def test_two_label_a_third_settles_and_the_report_shows_the_labels(themed) -> None:
    app, keys = themed
    anna, ben, arno, olga, rita, vic = (
        Person(app, n) for n in ("anna", "ben", "arno", "olga", "rita", "vic")
    )
    url = "/star/campaigns/demo/themes"
    page = anna.get(url).text
    rifle = cluster_section(page, keys[0])
    assert "rifle ammunition" in rifle and "Typical dialogue 1" in rifle and "needs labels" in rifle
    assert 'name="label"' in rifle and "Settle" not in rifle
    assert 'href="/star/campaigns/demo/themes"' in anna.get("/star/queue").text
    assert rita.get(url).status_code == vic.get(url).status_code == 403
    assert anna.get("/star/campaigns/nope/themes").status_code == 404

    for person, labels in ((anna, ["Weapons", "Baking"]), (ben, ["weapons.", "Cakes"])):
        for key, label in zip(keys[:2], labels, strict=True):
            done = person.post(f"{url}/label", key=key, label=label)
            assert done.status_code == 303 and done.headers["location"] == f"{url}#cluster-{key}"
    again = anna.post(f"{url}/label", key=keys[2], label=" ... ")  # no letter: the page says why
    assert again.status_code == 400 and "a label needs at least one letter" in again.text
    assert anna.post(f"{url}/label", key=keys[2], label="").status_code == 422
    assert anna.post(f"{url}/label", key="not-hex", label="x").status_code == 422

    cake = cluster_section(ben.get(url).text, keys[1])
    assert "the two labels differ" in cake and "Baking" in cake and "Cakes" in cake  # both in: shown
    assert "Settle" not in cake  # ben labelled it
    assert "Settle" not in cluster_section(anna.get(url).text, keys[1])
    assert anna.post(f"{url}/settle", key=keys[1], label="Baking").status_code == 403  # annotators never
    assert arno.post(f"{url}/settle", key=keys[0], label="x").status_code == 400  # agreed: nothing to settle
    assert 'value="Cakes"' in cluster_section(arno.get(url).text, keys[1])
    assert arno.post(f"{url}/settle", key=keys[1], label="Cakes").status_code == 303

    caught = guard_writes(app)  # every state the page can show, read without a write
    reader = TestClient(MarkGets(app), follow_redirects=False)
    sign_in(reader, "olga")
    for path in (url, f"{url}/labels.csv", "/api/v1/star/campaigns/demo/themes"):
        assert reader.get(path).status_code == 200
    assert caught == []

    page = olga.get(url).text
    assert "2 label(s) decided since this report" in page
    assert cluster_section(page, keys[0]).count("Weapons") >= 1 and "agreed" in cluster_section(page, keys[0])
    themes = rebuild_report(app)
    by_key = {c["key"]: str(c["cluster"]) for c in themes["clusters"]}
    assert themes["labels"][by_key[keys[0]]]["label"] == "Weapons"  # the first reviewer's spelling
    assert themes["labels"][by_key[keys[1]]]["decision"] == "settled"
    assert len(themes["labels"]) == 2 and themes["labels_unmatched"] == []
    report = olga.get("/star/campaigns/demo/report").text
    table = re.search(r'<table id="themes-table">.*?</table>', report, re.S).group(0)  # type: ignore[union-attr]
    assert (
        '<td class="l theme-label">Weapons</td>' in table and '<td class="l theme-label">Cakes</td>' in table
    )
    assert "2 of 4 clusters labelled" in report
    assert "decided since this report" not in olga.get(url).text
    for person in (anna, ben, arno, olga, rita, vic):
        person.client.close()


def run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["assay", "star", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert not exit_.value.code, args


def test_api_csv_download_and_the_command_line_report(themed, tmp_path: Path, monkeypatch) -> None:
    app, keys = themed
    assert keys[2] == cluster_key([THIRD])
    with app.state.sessions.begin() as session:
        users = {n: accounts.get_user(session, n) for n in ("anna", "olga", "arno", "rita")}
        tokens = {n: accounts.create_api_token(session, u, "t") for n, u in users.items()}  # type: ignore[arg-type]
    api = "/api/v1/star/campaigns/demo/themes"
    with TestClient(app, raise_server_exceptions=False) as client:

        def call(name: str, action: str, **body: str) -> tuple[int, dict]:
            headers = {"Authorization": f"Bearer {tokens[name]}"}
            answer = client.post(f"{api}/{action}", json=body, headers=headers)
            return answer.status_code, answer.json()

        assert call("anna", "label", key=keys[2], label="Loans") == (
            200,
            {"key": keys[2], "status": "labelling"},
        )
        assert call("olga", "label", key=keys[2], label="money") == (
            200,
            {"key": keys[2], "status": "disagreement"},
        )
        assert call("olga", "settle", key=keys[2], label="Loans")[0] == 400  # she labelled it
        assert call("rita", "label", key=keys[3], label="x")[0] == 403
        assert call("anna", "label", key=keys[3], label="x", extra="1")[0] == 422
        assert call("anna", "dance", key=keys[3], label="x")[0] == 404  # label or settle only: no such path
        assert call("arno", "settle", key=keys[2], label="Loans") == (
            200,
            {"key": keys[2], "status": "settled"},
        )
        board = client.get(api, headers={"Authorization": f"Bearer {tokens['anna']}"}).json()
        status = {c["key"]: (c["status"], c["label"], c["mine"]) for c in board["clusters"]}
        assert status[keys[2]] == ("settled", "Loans", "Loans")
        assert status[keys[3]] == ("labelling", None, None)
        assert board["report_at"].endswith("Z")  # UTC, said
        exported = client.get(f"{api}/labels", headers={"Authorization": f"Bearer {tokens['anna']}"}).json()
        assert exported["labels"] == [
            {"key": keys[2], "label": "Loans", "decision": "settled", "members": [THIRD]}
        ]
    anna = Person(app, "anna")
    download = anna.get("/star/campaigns/demo/themes/labels.csv")
    assert "attachment" in download.headers["content-disposition"]
    assert [r["label"] for r in csv.DictReader(io.StringIO(download.text))] == ["Loans"]
    edited = download.text.replace("Loans", "Mortgages")
    (tmp_path / "labels.csv").write_text(edited, encoding="utf-8")
    anna.client.close()

    database = str(app.state.sessions.kw["bind"].url)
    monkeypatch.setenv("ASSAY_DB_URL", database)
    common = ["report", "demo", "--embedder", "hashing", "--bootstrap", "0"]
    run_cli([*common, "--out", str(tmp_path / "from-db")], monkeypatch)  # labels agreed on the web
    run_cli(
        [*common, "--out", str(tmp_path / "from-file"), "--theme-labels", str(tmp_path / "labels.csv")],
        monkeypatch,
    )
    for folder, label in (("from-db", "Loans"), ("from-file", "Mortgages")):
        clusters = list(csv.DictReader((tmp_path / folder / "tables" / "themes_clusters.csv").open()))
        assert [r["label"] for r in clusters if r["key"] == keys[2]] == [label]
        assert {r["label"] for r in clusters if r["key"] != keys[2]} == {""}
        assert f">{label}</td>" in (tmp_path / folder / "report.html").read_text()
    again = list(csv.DictReader((tmp_path / "from-file" / "tables" / "themes_labels.csv").open()))
    assert [(r["key"], r["label"], r["members"]) for r in again] == [(keys[2], "Mortgages", THIRD)]
