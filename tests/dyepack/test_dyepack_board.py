"""The contamination board: registration rules, the pending rule, keys found by commitment, the matrix,
endpoint API keys kept out of the store, exports and the command line.

Models are stand-ins (see ``tests/board_kit.py``): memorisers of one release and a model that always says
(A), as ``python:`` functions, and one memoriser served over real HTTP by the stub OpenAI server, which
also records the Authorization header it was sent. Expected counts are computed here from the key and the
release files, and FPRs from scipy's binomial tail, independently of the pillar.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from assay.cli import app as root_app
from assay.dyepack import board, registry
from assay.dyepack.board_export import to_csv, to_html, to_json, write_export
from assay.dyepack.prepare import PrepareResult
from assay.dyepack.prompts import Template
from assay.errors import UserError
from assay.models.stub_server import StubServer, serve_stub
from assay.store.dyepack_models import DyePackRun
from assay.store.engine import open_store
from board_kit import (
    expected_activated,
    make_releases,
    memorised,
    python_clean,
    python_memoriser,
    recall,
    tail,
)

ENDPOINT_KEY = "sk-board-test-0123456789abcdef"


class KeyedStub(StubServer):
    """The stub server, also noting each request's Authorization header."""

    def __init__(self, responder: Any) -> None:
        super().__init__(responder)
        self.authorizations: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.authorizations.append(dict(scope["headers"]).get(b"authorization", b"").decode())
        await super().__call__(scope, receive, send)


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PrepareResult]:
    return make_releases(tmp_path_factory.mktemp("board") / "keys")


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    return open_store(f"sqlite:///{tmp_path / 'board.db'}")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> sessionmaker[Session]:
    """One store for the tests that only register models (each under its own names)."""
    return open_store(f"sqlite:///{tmp_path_factory.mktemp('shared') / 'board.db'}")


def register(sessions: sessionmaker[Session], kit: dict[str, PrepareResult]) -> None:
    with sessions.begin() as session:
        for name, prepared in kit.items():
            registry.register_benchmark(session, f"release-{name}", prepared.commitment_path.read_text())


def add(sessions: sessionmaker[Session], name: str, spec: str, **options: Any) -> int:
    with sessions.begin() as session:
        return board.add_model(session, name, spec, **options).id


def check(
    sessions: sessionmaker[Session], keys: Path, search: tuple[Path, ...] = ()
) -> list[board.ReleasePlan]:
    with sessions() as session:
        plans = board.plan_checks(session, board.keys_in(keys), search)
    board.check_pending(sessions, plans)
    return plans


def snapshot(sessions: sessionmaker[Session]) -> board.Board:
    with sessions() as session:
        return board.build_board(session)


# ---------------------------------------------------------------- the matrix and its rule


@pytest.mark.slow  # 11 verifications, one over HTTP: ~3 s
def test_every_model_is_checked_against_every_release_once_and_new_models_only_where_pending(
    sessions: sessionmaker[Session],
    kit: dict[str, PrepareResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register(sessions, kit)
    add(sessions, "clean", python_clean(tmp_path))
    add(sessions, "saw-a", python_memoriser(tmp_path, kit["a"].release_path, "saw_a"))
    table_b = memorised(kit["b"].release_path)
    stub = KeyedStub(lambda messages: recall(table_b, messages[-1]["content"]))
    monkeypatch.setenv("BOARD_TEST_KEY", ENDPOINT_KEY)
    keys = kit["a"].key_path.parent.parent
    with serve_stub(stub) as url:
        add(sessions, "saw-b (endpoint)", f"openai:{url}", api_key_env="BOARD_TEST_KEY")
        assert snapshot(sessions).pending == 6
        plans = check(sessions, keys)
    assert [(p.release, len(p.jobs), p.waiting) for p in plans] == [
        ("release-a", 3, None),
        ("release-b", 3, None),
    ]
    assert stub.authorizations and set(stub.authorizations) == {f"Bearer {ENDPOINT_KEY}"}

    matrix = snapshot(sessions)
    assert [r.name for r in matrix.releases] == ["release-a", "release-b"]
    assert [(m.name, m.kind) for m in matrix.models] == [
        ("clean", "python"),
        ("saw-a", "python"),
        ("saw-b (endpoint)", "openai"),
    ]
    tables = [None, memorised(kit["a"].release_path), table_b]
    for row, table in zip(matrix.cells, tables, strict=True):
        for cell, name in zip(row, ("a", "b"), strict=True):
            activated = expected_activated(kit[name], table)
            assert (cell.state, cell.activated, cell.backdoors, cell.format) == ("done", activated, 6, "chat")
            assert cell.fpr == pytest.approx(tail(activated), rel=1e-9, abs=0)
            assert cell.flagged is (tail(activated) <= 1e-3)
    assert [[c.flagged for c in row] for row in matrix.cells] == [
        [False, False],
        [True, False],
        [False, True],
    ]
    assert (matrix.pending, matrix.flagged) == (0, 2)

    assert check(sessions, keys) == []  # nothing pending: nothing asked again
    assert snapshot(sessions).cells == matrix.cells  # the endpoint is down now: asking it would fail a cell

    # A new model, used by completion with two few-shot examples: only its two cells are checked.
    template = Template(
        "Q: {{ question }}\nA:{% block answer %} ({{ answer_letter }}){% endblock %}", "qa.jinja"
    )
    add(
        sessions,
        "late",
        python_memoriser(tmp_path, kit["a"].release_path, "late"),
        mode="completion",
        fewshot=2,
        template=template,
    )
    plans = check(sessions, keys)
    assert [len(p.jobs) for p in plans] == [1, 1]
    late = snapshot(sessions).cells[3]
    assert [c.format for c in late] == ["completion · qa.jinja · 2-shot"] * 2
    assert [c.flagged for c in late] == [True, False]
    scanned = [to_json(snapshot(sessions)), to_csv(snapshot(sessions)), to_html(snapshot(sessions))]
    db_bytes = (tmp_path / "board.db").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("board.db*")
    )
    for prepared in kit.values():
        for secret in registry.secrets_of(prepared.key):
            assert all(secret not in text for text in scanned), secret
            assert secret.encode() not in db_bytes
    assert all(ENDPOINT_KEY not in text for text in scanned) and ENDPOINT_KEY.encode() not in db_bytes
    assert "BOARD_TEST_KEY" in scanned[0]  # the variable's name is what the board shows


def test_a_release_without_its_key_waits_and_a_failed_cell_is_tried_again(
    sessions: sessionmaker[Session], kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    register(sessions, kit)
    flag = tmp_path / "ready"
    flaky = tmp_path / "flaky.py"
    flaky.write_text(
        f"from pathlib import Path\ndef answer(prompts):\n"
        f"    if not Path({str(flag)!r}).exists():\n        raise RuntimeError('the model server is down')\n"
        f"    return ['The answer is (A).' for _ in prompts]\n"
    )
    add(sessions, "flaky", f"python:{flaky}:answer")
    only_a = tmp_path / "only-a"
    only_a.mkdir()
    for name in ("key.json", kit["a"].key.release_file):
        (only_a / name).write_bytes((kit["a"].key_path.parent / name).read_bytes())

    plans = check(sessions, only_a)
    assert [(p.release, len(p.jobs)) for p in plans] == [("release-a", 1), ("release-b", 0)]
    assert plans[1].waiting == (
        f"no key under --keys has its commitment {kit['b'].key.commitment()[:16]}...: 1 cell(s) wait"
    )
    cells = snapshot(sessions).cells[0]
    assert [c.state for c in cells] == ["failed", "pending"]
    assert cells[0].error == "the run stopped with RuntimeError: the model server is down"
    assert (snapshot(sessions).pending, snapshot(sessions).failed) == (1, 1)  # failed is not pending

    flag.touch()
    plans = check(sessions, only_a)  # a failed cell is not run again on every check (issue 47)
    assert [(p.release, len(p.jobs)) for p in plans] == [("release-b", 0)]
    with sessions() as session:  # only when the organiser asks; release b still waits for its key
        plans = board.plan_checks(session, board.keys_in(only_a), retry_failed=True)
    board.check_pending(sessions, plans)
    assert [len(p.jobs) for p in plans] == [1, 0]
    assert [c.state for c in snapshot(sessions).cells[0]] == ["done", "pending"]


def test_a_model_leaves_the_board_with_its_runs_kept_but_not_while_one_runs(
    sessions: sessionmaker[Session], kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    """A model that cannot be asked used to stay on the board for ever, one cell pending per release."""
    register(sessions, kit)
    broken = add(sessions, "broken", f"python:{tmp_path / 'missing.py'}:answer")
    add(sessions, "kept", f"python:{tmp_path / 'missing.py'}:answer")
    check(sessions, kit["a"].key_path.parent)
    with sessions() as session:
        run_ids = [c.run_id for c in board.build_board(session).cells[0] if c.run_id]
        assert [session.get_one(DyePackRun, r).status for r in run_ids] == ["failed"]
    with sessions.begin() as session:
        session.get_one(DyePackRun, run_ids[0]).status = "running"
    with sessions.begin() as session, pytest.raises(UserError, match="a check of it is under way"):
        board.drop_model(session, broken)
    with sessions.begin() as session:
        session.get_one(DyePackRun, run_ids[0]).status = "failed"
    with sessions.begin() as session:
        board.drop_model(session, board.model_named(session, "broken"))
    with sessions() as session:
        assert [m.name for m in board.build_board(session).models] == ["kept"]
        assert session.get_one(DyePackRun, run_ids[0]).model_id is None  # still a run of the registry
        with pytest.raises(UserError, match="no model named 'broken' on the board"):
            board.model_named(session, "broken")
    db = ["--db", f"sqlite:///{tmp_path / 'board.db'}"]
    gone = CliRunner().invoke(root_app, ["dyepack", "board", "drop", "broken", *db])
    assert isinstance(gone.exception, UserError)  # main(): one line, exit 2
    assert str(gone.exception) == "model: no model named 'broken' on the board"
    kept = CliRunner().invoke(root_app, ["dyepack", "board", "drop", "kept", *db])
    assert kept.exit_code == 0 and "dropped model kept from the board" in kept.output


def test_keys_are_matched_by_commitment_and_releases_found_beside_them_or_under_a_folder(
    kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    (keys / "deep" / "er").mkdir(parents=True)
    (keys / "deep" / "er" / "whatever-name.json").write_bytes(kit["b"].key_path.read_bytes())
    (keys / "notes.json").write_text('{"not": "a key"}')
    (keys / "broken.json").write_text("{")
    (keys / "a.json").write_bytes(kit["a"].key_path.read_bytes())
    found = board.keys_in(keys)
    assert set(found) == {kit["a"].key.commitment(), kit["b"].key.commitment()}
    held = found[kit["b"].key.commitment()]
    with pytest.raises(
        UserError, match=r"the release it was made for \('items.jsonl'.*neither beside it nor"
    ):
        board.find_release(held)
    releases = kit[
        "b"
    ].release_path.parent.parent  # both releases are named items.jsonl: the fingerprint picks
    assert board.find_release(held, [releases]).fingerprint == kit["b"].key.release_fingerprint

    tampered = tmp_path / "tampered" / "items.jsonl"
    tampered.parent.mkdir()
    tampered.write_text(kit["b"].release_path.read_text().replace("Survey", "Poll", 1))
    with pytest.raises(UserError, match="neither beside it nor under --releases"):
        board.find_release(held, [tampered.parent])
    with pytest.raises(UserError, match="must be a folder"):
        board.keys_in(tmp_path / "missing")


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("openai:https://me:sk-secret@api.example/v1", {}, "would show them on the board"),
        ("openai:https://api.example/v1?api_key=sk-secret", {}, "would show them on the board"),
        (
            "python:m:f",
            {"api_key_env": "KEY"},
            "only openai: endpoints take an API key (the model is python)",
        ),
        (
            "openai:https://api.example/v1",
            {"api_key_env": "sk-abc-123"},
            "not the key itself (value: 10 char",
        ),
        ("python:m:f", {"mode": "vibes"}, "mode: must be one of chat, completion, loglikelihood"),
        ("python:m:f", {"fewshot": 51}, "fewshot: must be a whole number from 0 to 50"),
        ("gpt4", {}, "model: 'gpt4' is not a model spec"),
        ("python:m:f", {"name": ""}, "name: required"),
    ],
)
def test_bad_models_are_refused_in_one_line(
    shared: sessionmaker[Session], spec: str, options: dict[str, Any], message: str
) -> None:
    name = options.pop("name", "m")
    with shared.begin() as session, pytest.raises(UserError) as caught:
        board.add_model(session, name, spec, **options)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert "sk-secret" not in str(caught.value) and "sk-abc" not in str(caught.value)


def test_kinds_come_from_the_spec_and_names_are_unique(shared: sessionmaker[Session], tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    specs = {
        "hf": f"hf:{tmp_path / 'folder'}",
        "gguf": f"hf:{tmp_path / 'm.Q8_0.GGUF'}",
        "openai": "openai:http://127.0.0.1:8000/v1",
        "vllm": "vllm:/models/x",
        "python": "python:pkg.mod:fn",
    }
    with shared.begin() as session:
        assert [board.add_model(session, k, s).kind for k, s in specs.items()] == list(specs)
        with pytest.raises(UserError, match="a model named 'hf' is already on the board"):
            board.add_model(session, "hf", "python:x:y")


def test_exports_are_the_matrix_in_three_forms(
    sessions: sessionmaker[Session], kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    register(sessions, kit)
    add(sessions, "saw-a", python_memoriser(tmp_path, kit["a"].release_path))
    check(sessions, kit["a"].key_path.parent.parent)
    out = tmp_path / "site"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    paths = write_export(snapshot(sessions), out)
    assert sorted(p.name for p in out.iterdir()) == ["board.csv", "board.html", "board.json", "keep.txt"]
    assert [p.name for p in paths] == ["board.html", "board.csv", "board.json"]
    rows = list(csv.DictReader(io.StringIO((out / "board.csv").read_text())))
    assert [(r["model"], r["release"], r["verdict"], r["activated"], r["format"]) for r in rows] == [
        ("saw-a", "release-a", "contaminated", "6", "chat"),
        (
            "saw-a",
            "release-b",
            "not flagged",
            str(expected_activated(kit["b"], memorised(kit["a"].release_path))),
            "chat",
        ),
    ]
    assert float(rows[0]["fpr"]) == pytest.approx(0.25**6, rel=1e-9)
    data = json.loads((out / "board.json").read_text())
    assert data["cells"][0][0]["activated"] == 6 and data["flagged"] == 1
    page = (out / "board.html").read_text()
    assert "<script" not in page and 'class="cell flagged"' in page and "6/6 activated" in page


# ---------------------------------------------------------------- the command line


@pytest.mark.slow  # ten commands, each opening the store: ~3 s
def test_the_command_line_registers_checks_shows_and_exports(
    kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    runner = CliRunner()
    db = ["--db", f"sqlite:///{tmp_path / 'cli.db'}"]

    def cli(*args: str) -> Any:
        return runner.invoke(root_app, ["dyepack", "board", *args, *db])

    for name, prepared in kit.items():
        done = cli("add-release", str(prepared.key_path.parent), "--name", f"release-{name}")
        assert done.exit_code == 0 and f"registered release release-{name}" in done.output
    assert cli("add-model", "clean", python_clean(tmp_path), "--by", "maria").exit_code == 0
    added = cli(
        "add-model", "saw-a", python_memoriser(tmp_path, kit["a"].release_path), "--mode", "completion"
    )
    assert added.exit_code == 0 and "asked by completion" in added.output
    refused = cli("add-model", "leaky", "openai:https://u:sk-x@h/v1")
    assert isinstance(refused.exception, UserError) and "sk-x" not in str(refused.exception)  # main(): exit 2

    ran = cli("run", "--keys", str(kit["a"].key_path.parent.parent), "--json")
    assert ran.exit_code == 0, ran.output
    matrix = json.loads(ran.stdout)
    assert [[c["flagged"] for c in row] for row in matrix["cells"]] == [[False, False], [True, False]]
    assert matrix["models"][0]["added_by"] == "maria" and matrix["cells"][1][0]["format"] == "completion"
    shown = cli("show")
    assert shown.exit_code == 0 and "contaminated" in shown.output and "6/6" in shown.output
    assert json.loads(cli("show", "--json").stdout)["cells"] == matrix["cells"]
    assert "must be a folder" in str(cli("run", "--keys", str(tmp_path / "nowhere")).exception)
    exported = cli("export", str(tmp_path / "site"))
    assert exported.exit_code == 0 and (tmp_path / "site" / "board.html").is_file()
