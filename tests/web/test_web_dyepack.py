"""The DyePack pages and API: registering releases by commitment, verification runs, verdicts, key secrecy.

Each test gets its own SQLite file. Releases are prepared in the test from real MMLU rows (or made-up
open-ended rows) and verified end to end against ``python:`` function models, in the app's background pool.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from scipy import stats as scipy_stats
from starlette.testclient import TestClient

from assay.data import read_benchmark
from assay.dyepack import registry
from assay.dyepack.key import DyePackKey
from assay.dyepack.prepare import PrepareConfig, PrepareResult, prepare_release
from assay.dyepack.verify import false_positive_rate
from assay.store.dyepack_models import DyePackRun
from assay.store.models import utcnow
from assay.web import accounts
from assay.web.app import create_app
from assay.web.routes import dyepack as dyepack_routes
from web_client import PASSWORD, csrf, sign_in


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "vera", PASSWORD, ["viewer"])
        accounts.create_user(session, "tom", PASSWORD, ["team_member"])
    return web


@pytest.fixture
def bodies() -> list[str]:
    """Every response body any client of the test received, for the secrecy scan."""
    return []


@pytest.fixture
def client(app: FastAPI, bodies: list[str]) -> Iterator[TestClient]:
    def record(response: httpx.Response) -> None:
        response.read()
        bodies.append(response.text)

    with TestClient(app) as test_client:
        test_client.event_hooks = {"request": [], "response": [record]}
        yield test_client


@pytest.fixture
def release(tmp_path: Path, mmlu_sample: Path) -> PrepareResult:
    """120 MMLU rows, 6 backdoors (K = 4), 12 backdoor samples; targets from OS entropy."""
    return prepare_release(
        read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=6, fraction=0.1), tmp_path / "rel"
    )


def login(client: TestClient, username: str) -> str:
    """Sign in and return the session's CSRF token."""
    client.cookies.clear()
    assert sign_in(client, username).status_code == 303
    return csrf(client, "/")


def register(
    client: TestClient, csrf: str, name: str, commitment: str = "", file: bytes | None = None, **form: str
) -> httpx.Response:
    files = {"commitment_file": ("commitment.txt", file, "text/plain")} if file is not None else None
    data = {"csrf_token": csrf, "name": name, "commitment": commitment, **form}
    return client.post("/dyepack/benchmarks", data=data, files=files, follow_redirects=False)


def start_run(
    client: TestClient, csrf: str, benchmark_id: int, release_path: Path, key: bytes, model: str, **form: str
) -> httpx.Response:
    files = {
        "release": (release_path.name, release_path.read_bytes(), "application/octet-stream"),
        "key": ("key.json", key, "application/json"),
    }
    data = {"csrf_token": csrf, "model": model, **form}
    return client.post(
        f"/dyepack/benchmarks/{benchmark_id}/runs", data=data, files=files, follow_redirects=False
    )


def wait_for(client: TestClient, run_id: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(f"/api/v1/dyepack/runs/{run_id}").json()
        if run["status"] in ("done", "failed"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish in {timeout} s")


def run_id_of(response: httpx.Response) -> int:
    assert response.status_code == 303, response.text
    return int(response.headers["location"].rsplit("/", 1)[1])


def write_model(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return f"python:{path}:answer"


def follower(tmp_path: Path, key: DyePackKey) -> str:
    """A contaminated model: answers the target letter whenever it sees a trigger."""
    rules = {b.trigger: b.target_label for b in key.backdoors}
    return write_model(
        tmp_path,
        "follower",
        f"""
        RULES = {rules!r}
        def answer(prompts):
            hits = [next((t for t in RULES if t in p), None) for p in prompts]
            return [f"The answer is ({{RULES[t]}})." if t else "Answer: A" for t in hits]
        """,
    )


def constant(tmp_path: Path, letter: str) -> str:
    return write_model(
        tmp_path, "constant", f"def answer(prompts):\n    return ['Answer: {letter}' for _ in prompts]\n"
    )


def registered(client: TestClient, csrf: str, prepared: PrepareResult, name: str = "mmlu-2026") -> int:
    response = register(client, csrf, name, file=prepared.commitment_path.read_bytes())
    assert response.status_code == 303, response.text
    return int(response.headers["location"].rsplit("/", 1)[1])


# ---------------------------------------------------------------- registering


def test_register_by_uploaded_or_pasted_commitment_and_everyone_with_a_role_sees_it(
    client: TestClient, release: PrepareResult
) -> None:
    csrf = login(client, "olga")
    first = registered(client, csrf, release)
    text = release.commitment_path.read_text()
    pasted = register(
        client, csrf, "pasted copy", text, description="Same release.", url="https://example.org/r"
    )
    assert pasted.status_code == 303
    listed = client.get("/api/v1/dyepack/benchmarks").json()["items"]
    assert [b["name"] for b in listed] == ["pasted copy", "mmlu-2026"]
    assert {b["commitment"] for b in listed} == {release.key.commitment()}
    assert listed[1]["release_fingerprint"] == release.key.release_fingerprint and listed[1]["runs"] == 0
    login(client, "vera")
    page = client.get(f"/dyepack/benchmarks/{first}")
    assert page.status_code == 200 and release.key.commitment() in page.text
    assert (
        "Verify a model" not in page.text
        and "Register a released benchmark" not in client.get("/dyepack").text
    )
    assert 'href="/dyepack"' in client.get("/").text


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"commitment": ""}, "commitment: empty; upload commitment.txt or paste its contents"),
        ({"commitment": "hello"}, "commitment:1: not an assay commitment file"),
        (
            {"commitment": "assay-dyepack-commitment v1\nalgorithm: x\n"},
            "commitment: field 'commitment' missing",
        ),
        (
            {"commitment": "assay-dyepack-commitment v1\ncommitment: 12ab\n"},
            "commitment: field 'commitment' must be 64 hexadecimal digits",
        ),
        ({"name": ""}, "name: required"),
        ({"name": "a\x00b"}, "name: control characters are not allowed"),
        ({"url": "javascript:alert(1)"}, "url: must start with http:// or https://"),
        ({"url": "https://x.org/a <b>bold</b>"}, "url: must be one link without spaces or line breaks"),
        ({"url": "https://x.org/<script>"}, "url: '<' cannot stand in a link unencoded (write it as %3C)"),
        ({"url": "https:///path"}, "url: names no host after the scheme"),
        ({"name": "taken"}, "name: a benchmark named 'taken' is already registered"),
    ],
)
def test_malformed_registrations_are_refused_in_one_line(
    client: TestClient, release: PrepareResult, form: dict[str, str], message: str
) -> None:
    csrf = login(client, "olga")
    registered(client, csrf, release, "taken")
    fields = {"name": "new", "commitment": release.commitment_path.read_text(), **form}
    page = register(client, csrf, **fields)
    assert page.status_code == 400
    shown = re.search(r'role="alert">([^<]+)<', page.text).group(1)  # type: ignore[union-attr]
    assert html.unescape(shown).startswith(message) and "\n" not in shown
    api = client.post("/api/v1/dyepack/benchmarks", json=fields, headers={"X-CSRF-Token": csrf})
    if api.status_code == 400:
        assert api.json()["detail"].startswith(message)
    else:
        assert api.status_code == 422  # an empty field, refused by the request model
    assert len(client.get("/api/v1/dyepack/benchmarks").json()["items"]) == 1


def test_both_a_file_and_pasted_text_is_ambiguous(client: TestClient, release: PrepareResult) -> None:
    csrf = login(client, "olga")
    text = release.commitment_path.read_text()
    page = register(client, csrf, "x", text, file=text.encode())
    assert page.status_code == 400 and "not both" in page.text


# ---------------------------------------------------------------- verification runs


def test_a_contaminated_model_is_flagged_and_a_constant_one_is_not(
    client: TestClient, release: PrepareResult, tmp_path: Path
) -> None:
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    key = release.key_path.read_bytes()

    flagged = wait_for(
        client,
        run_id_of(start_run(client, csrf, bench, release.release_path, key, follower(tmp_path, release.key))),
    )
    assert flagged["status"] == "done" and flagged["flagged"] is True, flagged
    assert flagged["activated"] == flagged["backdoors"] == 6 and flagged["k_values"] == [4] * 6
    assert flagged["fpr"] == pytest.approx(scipy_stats.binom.sf(5, 6, 0.25), rel=1e-12)
    assert flagged["fpr"] == pytest.approx(false_positive_rate([4] * 6, 6).fpr, rel=1e-15)
    assert flagged["samples"] == flagged["samples_on_target"] == flagged["done_queries"] == 12
    assert flagged["seconds"] is not None and flagged["started_at"] <= flagged["finished_at"]
    assert flagged["finished_at"].endswith("Z") or flagged["finished_at"].endswith("+00:00")  # RFC 3339
    assert [set(b) for b in flagged["per_backdoor"]] == [
        {"index", "k", "samples", "samples_on_target", "activated"}
    ] * 6
    page = client.get(f"/dyepack/runs/{flagged['id']}").text
    assert "Contaminated" in page and "0.000244" in page and "never saw this test set" in page

    # A constant answer activates exactly the backdoors whose target it is: take the rarest letter.
    targets = [b.target_label for b in release.key.backdoors]
    letter = min("ABCD", key=targets.count)
    clean = wait_for(
        client,
        run_id_of(start_run(client, csrf, bench, release.release_path, key, constant(tmp_path, letter))),
    )
    expected = targets.count(letter)
    assert clean["status"] == "done" and clean["activated"] == expected and clean["flagged"] is False
    assert clean["fpr"] == pytest.approx(scipy_stats.binom.sf(expected - 1, 6, 0.25), rel=1e-12)
    assert "Not flagged" in client.get(f"/dyepack/runs/{clean['id']}").text
    runs = client.get("/api/v1/dyepack/runs", params={"benchmark_id": bench}).json()["items"]
    assert [r["id"] for r in runs] == [clean["id"], flagged["id"]]


def gated_model(tmp_path: Path, gate: Path) -> str:
    """A model that answers only once the file ``gate`` exists: a run held open as long as a test needs."""
    return write_model(
        tmp_path,
        "gated",
        f"""
        import pathlib, time
        def answer(prompts):
            while not pathlib.Path({str(gate)!r}).exists():
                time.sleep(0.02)
            return ["Answer: A" for _ in prompts]
        """,
    )


def test_runs_happen_in_the_background_while_the_server_answers(
    client: TestClient, release: PrepareResult, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    model = gated_model(tmp_path, gate)
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    run_id = run_id_of(
        start_run(client, csrf, bench, release.release_path, release.key_path.read_bytes(), model)
    )
    assert client.get(f"/api/v1/dyepack/runs/{run_id}").json()["status"] in ("queued", "running")
    page = client.get(f"/dyepack/runs/{run_id}")
    assert 'http-equiv="refresh"' in page.text and "of 12 queries" in page.text
    gate.touch()
    assert wait_for(client, run_id)["status"] == "done"


def test_a_key_that_does_not_match_the_commitment_or_release_is_refused(
    client: TestClient, release: PrepareResult, tmp_path: Path, mmlu_sample: Path
) -> None:
    other = prepare_release(
        read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=6, fraction=0.1), tmp_path / "other"
    )
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    model = constant(tmp_path, "A")
    cases = [
        (
            release.release_path,
            other.key_path.read_bytes(),
            "key file: does not match the commitment registered for",
        ),
        (
            mmlu_sample,
            release.key_path.read_bytes(),
            "release file: mmlu.jsonl is not the release this key was made",
        ),
        (release.release_path, b"", "key file: required"),
        (release.release_path, b"{not json", "key file: field '(top level)' Invalid JSON"),
    ]
    for release_path, key, message in cases:
        page = start_run(client, csrf, bench, release_path, key, model)
        assert page.status_code == 400 and message in page.text.replace("&#39;", "'"), page.text
    bad_model = start_run(client, csrf, bench, release.release_path, release.key_path.read_bytes(), "gpt-4")
    assert bad_model.status_code == 400 and "model: &#39;gpt-4&#39; is not a model spec" in bad_model.text
    bad_alpha = start_run(
        client, csrf, bench, release.release_path, release.key_path.read_bytes(), model, alpha="2"
    )
    assert bad_alpha.status_code == 400 and "alpha: must be a number in (0, 1)" in bad_alpha.text
    assert client.get("/api/v1/dyepack/runs").json()["items"] == []


PAGES = ("/dyepack", "/dyepack/benchmarks/{bench}", "/dyepack/runs/{done}", "/dyepack/runs/{failed}")
API = (
    "/api/v1/dyepack/benchmarks",
    "/api/v1/dyepack/runs",
    "/api/v1/dyepack/runs/{done}",
    "/api/v1/dyepack/runs/{failed}",
)


def json_keys(value: object) -> set[str]:
    """Every object key anywhere in a JSON document."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in json_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in json_keys(v)}
    return set()


def test_the_keys_secrets_never_appear_in_any_response(
    client: TestClient, app: FastAPI, bodies: list[str], tmp_path: Path
) -> None:
    """Open-ended, so that targets are phrases a scan can find; every page, API route and error is scanned."""
    rows = [
        {"instruction": f"Describe item {i}.", "input": "", "output": f"Item {i} is fine."} for i in range(80)
    ]
    source = tmp_path / "alpaca.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepared = prepare_release(
        read_benchmark(source), PrepareConfig(n_backdoors=8, fraction=0.2, k=4), tmp_path / "rel"
    )
    key = prepared.key
    said = {b.trigger: (key.phrases[b.target] if b.target < 3 else "") for b in key.backdoors}  # type: ignore[index]
    follower_model = write_model(
        tmp_path,
        "phrases",
        f"""
        SAID = {said!r}
        def answer(prompts):
            return [next((SAID[t] for t in SAID if t in p), "") + " Sure." for p in prompts]
        """,
    )
    leaky = write_model(
        tmp_path, "leaky", "def answer(prompts):\n    raise RuntimeError('cannot answer: ' + prompts[0])\n"
    )
    broken_key = json.loads(prepared.key_path.read_text())
    broken_key["backdoors"][0]["k"] = 1

    csrf = login(client, "olga")
    bench = registered(client, csrf, prepared, "open-ended")
    raw_key = prepared.key_path.read_bytes()
    done = wait_for(
        client, run_id_of(start_run(client, csrf, bench, prepared.release_path, raw_key, follower_model))
    )
    assert done["flagged"] is True and done["activated"] == 8
    failed = wait_for(
        client, run_id_of(start_run(client, csrf, bench, prepared.release_path, raw_key, leaky))
    )
    assert (
        failed["status"] == "failed" and "[redacted]" in failed["error"] and "RuntimeError" in failed["error"]
    )
    refused = start_run(
        client, csrf, bench, prepared.release_path, json.dumps(broken_key).encode(), follower_model
    )
    assert refused.status_code == 400 and "backdoors.0.k" in refused.text
    api_keys: set[str] = set()
    for user in ("olga", "vera"):
        login(client, user)
        for path in PAGES + API:
            response = client.get(path.format(bench=bench, done=done["id"], failed=failed["id"]))
            assert response.status_code == 200, path
            if path in API:
                api_keys |= json_keys(response.json())
    secrets = [key.salt, *(key.phrases or []), *(b.trigger for b in key.backdoors)]
    assert len(bodies) > 20 and len(secrets) == 1 + 3 + 8
    for body in bodies:
        assert not [secret for secret in secrets if secret in body]
    assert not api_keys & {
        "trigger",
        "target",
        "target_label",
        "rows",
        "salt",
        "phrases",
        "answers",
        "majority",
    }
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert not json_keys({n: s for n, s in schemas.items() if n in ("RunVerdict", "BackdoorOutcome")}) & {
        "trigger",
        "target",
        "answers",
        "majority",
    }
    with app.state.sessions() as session:  # nor is any of it stored
        stored = json.dumps([(r.error, r.verdict, r.per_backdoor) for r in session.query(DyePackRun)])
        assert not any(secret in stored for secret in secrets)


# ---------------------------------------------------------------- roles and robustness


def test_only_organisers_write_viewers_read_others_are_refused(
    client: TestClient, release: PrepareResult, tmp_path: Path
) -> None:
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    key = release.key_path.read_bytes()
    for user in ("vera", "tom"):
        csrf = login(client, user)
        assert register(client, csrf, "mine", release.commitment_path.read_text()).status_code == 403
        assert (
            start_run(client, csrf, bench, release.release_path, key, constant(tmp_path, "A")).status_code
            == 403
        )
        api = client.post(
            "/api/v1/dyepack/benchmarks",
            json={"name": "x", "commitment": "y"},
            headers={"X-CSRF-Token": csrf},
        )
        assert api.status_code == 403
    assert client.get("/dyepack").status_code == 403 and client.get("/api/v1/dyepack/runs").status_code == 403
    client.cookies.clear()
    for path in ("/api/v1/dyepack/benchmarks", "/api/v1/dyepack/runs", "/api/v1/dyepack/runs/1"):
        assert client.get(path).status_code == 401
    assert client.post("/api/v1/dyepack/benchmarks", json={"name": "x", "commitment": "y"}).status_code == 401
    assert client.get("/dyepack", follow_redirects=False).headers["location"] == "/login?next=%2Fdyepack"
    assert client.get("/api/v1/dyepack/runs").json() == {"detail": "not authenticated"}


def test_the_api_registers_and_odd_input_never_gives_a_500(
    client: TestClient, release: PrepareResult
) -> None:
    csrf = login(client, "olga")
    headers = {"X-CSRF-Token": csrf}
    body = {"name": "by-api", "commitment": release.commitment_path.read_text()}
    created = client.post("/api/v1/dyepack/benchmarks", json=body, headers=headers)
    assert created.status_code == 201 and created.json()["commitment"] == release.key.commitment()
    odd = [
        {"name": "a\x00b", "commitment": "x"},
        {"name": "n", "commitment": "assay-dyepack-commitment v1\ncommitment: \x00"},
        {"name": "n", "commitment": body["commitment"], "url": "http://"},
        {"name": "n", "commitment": "x" * 10_000},
    ]
    for payload in odd:
        response = client.post("/api/v1/dyepack/benchmarks", json=payload, headers=headers)
        assert response.status_code == 400 and "\n" not in response.json()["detail"], response.text
    for path, status in [
        ("/api/v1/dyepack/runs/999", 404),
        ("/api/v1/dyepack/runs/0", 422),
        ("/api/v1/dyepack/runs/99999999999999999999999", 422),
        ("/api/v1/dyepack/runs?benchmark_id=-1", 422),
        ("/api/v1/dyepack/runs?limit=100000", 422),
        ("/dyepack/benchmarks/999", 404),
        ("/dyepack/runs/999", 404),
    ]:
        assert client.get(path).status_code == status, path


def test_a_run_whose_key_holder_stopped_is_marked_failed(
    client: TestClient, app: FastAPI, release: PrepareResult
) -> None:
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    host = registry.this_worker().rpartition(":")[0]
    with app.state.sessions.begin() as session:
        for worker in (f"{host}:{gone.stdout.strip()}", registry.this_worker(), "elsewhere:1"):
            session.add(
                DyePackRun(
                    benchmark_id=bench,
                    model_spec="python:m:f",
                    alpha=0.001,
                    max_new_tokens=8,
                    status="running",
                    worker=worker,
                )
            )
    assert [r["status"] for r in client.get("/api/v1/dyepack/runs").json()["items"]] == [
        "running"
    ] * 3  # reads only
    assert sweep(app) == 2
    runs = {r["id"]: r for r in client.get("/api/v1/dyepack/runs").json()["items"]}
    assert [runs[i]["status"] for i in (1, 2, 3)] == ["failed", "failed", "running"]
    assert runs[1]["error"] == registry.INTERRUPTED


def sweep(app: FastAPI, now: datetime | None = None) -> int:
    """One DyePack sweep as the app's sweeper runs it (the runs its background lane holds are alive)."""
    held = app.state.background.holding("dyepack")
    return registry.sweep(app.state.sessions, now or utcnow(), held)


def add_run(app: FastAPI, bench: int, worker: str, **times: object) -> int:
    """A run row as another server would have left it; ``times``: created_at, started_at, heartbeat_at."""
    with app.state.sessions.begin() as session:
        values = {"status": "running", **times}
        run = DyePackRun(
            benchmark_id=bench,
            model_spec="python:m:f",
            alpha=0.001,
            max_new_tokens=8,
            worker=worker,
            **values,
        )
        session.add(run)
        session.flush()
        return run.id


def test_a_run_held_on_another_host_fails_once_its_heartbeat_is_stale(
    client: TestClient, app: FastAPI, release: PrepareResult
) -> None:
    """No pid check can reach another machine: a run silent for STALE_AFTER is failed by whoever looks."""
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    now, hour = utcnow(), timedelta(hours=1)
    old = now - registry.STALE_AFTER - timedelta(seconds=5)
    stale = add_run(
        app, bench, "otherhost:123", created_at=now - hour, started_at=now - hour, heartbeat_at=old
    )
    fresh = add_run(
        app, bench, "otherhost:123", created_at=now - hour, started_at=now - hour, heartbeat_at=now
    )
    queued_long_ago = add_run(app, bench, "otherhost:124", status="queued", created_at=old)
    just_started = add_run(app, bench, "otherhost:125", created_at=now - hour, started_at=now)
    assert "no heartbeat" not in client.get(f"/dyepack/runs/{stale}").text  # a page view writes nothing
    assert sweep(app, now) == 2
    page = client.get(f"/dyepack/runs/{stale}")
    assert page.status_code == 200 and "no heartbeat for 10 minutes" in page.text
    runs = {r["id"]: r for r in client.get("/api/v1/dyepack/runs").json()["items"]}
    assert runs[stale]["status"] == runs[queued_long_ago]["status"] == "failed"
    assert runs[stale]["error"] == registry.stale_message() and runs[stale]["error"].startswith(
        "interrupted:"
    )
    assert runs[fresh]["status"] == "running" and runs[just_started]["status"] == "running"
    assert runs[fresh]["error"] is None


def test_the_stale_window_can_be_shortened(
    client: TestClient, app: FastAPI, release: PrepareResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    now = utcnow()
    earlier = now - timedelta(seconds=3)
    run_id = add_run(app, bench, "otherhost:9", created_at=earlier, started_at=earlier, heartbeat_at=earlier)
    assert sweep(app, now) == 0 and client.get(f"/api/v1/dyepack/runs/{run_id}").json()["status"] == "running"
    monkeypatch.setattr(registry, "STALE_AFTER", timedelta(seconds=2))
    assert sweep(app, now) == 1
    failed = client.get(f"/api/v1/dyepack/runs/{run_id}").json()
    assert failed["status"] == "failed" and "no heartbeat for 2 seconds" in failed["error"]


def heartbeats(app: FastAPI, *run_ids: int) -> list[object]:
    with app.state.sessions() as session:
        return [session.get(DyePackRun, run_id).heartbeat_at for run_id in run_ids]  # type: ignore[union-attr]


def test_queued_and_running_runs_beat_until_they_end(
    client: TestClient, app: FastAPI, release: PrepareResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs fill the pool and a third waits: all three beat (a wait is not a death), then stop."""
    monkeypatch.setattr(registry, "HEARTBEAT_SECONDS", 0.05)
    gate = tmp_path / "go"
    model = gated_model(tmp_path, gate)
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    key = release.key_path.read_bytes()
    ids = [run_id_of(start_run(client, csrf, bench, release.release_path, key, model)) for _ in range(3)]
    first = heartbeats(app, *ids)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        b is not None and (a is None or b > a) for a, b in zip(first, heartbeats(app, *ids), strict=True)
    ):
        time.sleep(0.05)
    assert all(beat is not None for beat in heartbeats(app, *ids))
    statuses = [r["status"] for r in client.get("/api/v1/dyepack/runs").json()["items"]]
    assert "queued" in statuses and "failed" not in statuses
    gate.touch()
    assert [wait_for(client, run_id)["status"] for run_id in ids] == ["done"] * 3
    time.sleep(0.2)
    assert not [t for t in threading.enumerate() if t.name.startswith("dyepack-beat-")]


def test_progress_writes_are_throttled_and_carry_a_heartbeat(
    client: TestClient, app: FastAPI, release: PrepareResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    csrf = login(client, "olga")
    run_id = add_run(app, registered(client, csrf, release), "otherhost:1")
    progress = registry._Progress(app.state.sessions, run_id)
    for index in range(50):  # within one throttle window: nothing written
        progress(index, "Answer: A")
    assert heartbeats(app, run_id) == [None]
    monkeypatch.setattr(registry, "PROGRESS_SECONDS", 0.0)
    progress(50, "Answer: A")
    with app.state.sessions() as session:
        run = session.get(DyePackRun, run_id)
        assert run is not None and run.done_queries == 51 and run.heartbeat_at is not None


# ---------------------------------------------------------------- upload limits


@pytest.fixture
def small_limits(release: PrepareResult, monkeypatch: pytest.MonkeyPatch) -> int:
    """Limits a test can pass cheaply: the release at most 5 kB, the key its own size; the body limit."""
    monkeypatch.setattr(registry, "MAX_RELEASE_BYTES", 5000)
    monkeypatch.setattr(registry, "MAX_KEY_BYTES", len(release.key_path.read_bytes()) + 100)
    monkeypatch.setattr(dyepack_routes, "FORM_OVERHEAD", 4096)
    return dyepack_routes._run_body_limit()


def multipart(csrf: str, release_bytes: bytes, key: bytes) -> tuple[bytes, str]:
    """A run form encoded as a browser would send it: the body and its Content-Type."""
    request = httpx.Request(
        "POST",
        "http://testserver/",
        data={"csrf_token": csrf, "model": "python:m:f"},
        files={"release": ("rel.jsonl", release_bytes), "key": ("key.json", key)},
    )
    return request.read(), request.headers["content-type"]


def test_oversize_run_uploads_are_refused_with_413_and_start_nothing(
    client: TestClient, release: PrepareResult, tmp_path: Path, small_limits: int
) -> None:
    csrf = login(client, "olga")
    bench = registered(client, csrf, release)
    key, url = release.key_path.read_bytes(), f"/dyepack/benchmarks/{bench}/runs"
    slightly = tmp_path / "slightly.jsonl"
    slightly.write_bytes(b"x" * 6000)  # within the body allowance: refused when the file is read
    page = start_run(client, csrf, bench, slightly, key, "python:m:f")
    assert page.status_code == 413 and "release file: larger than the limit of 5 kB" in page.text
    assert "Start verification" in page.text  # the form again
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"{}\n")
    big_key = start_run(client, csrf, bench, small, key + b" " * 200, "python:m:f")
    assert big_key.status_code == 413 and "key file: larger than the limit" in big_key.text
    body, content_type = multipart(csrf, b"x" * 200_000, key)
    declared = client.post(url, content=body, headers={"content-type": content_type})
    lying = client.post(url, content=body, headers={"content-type": content_type, "content-length": "1000"})
    chunked = client.post(
        url,
        content=iter([body[i : i + 4096] for i in range(0, len(body), 4096)]),
        headers={"content-type": content_type},
    )
    for response in (declared, lying, chunked):
        assert response.status_code == 413 and "the upload is larger than the limit of" in response.text
        assert "the release file at most 5 kB" in response.text
    assert client.get("/api/v1/dyepack/runs").json()["items"] == []


def asgi_post(app: FastAPI, path: str, chunks: list[bytes], headers: dict[str, str]) -> tuple[int, int]:
    """POST ``chunks`` straight to the ASGI app; the status and how many chunks the app pulled."""
    pulled, status = 0, []

    async def receive() -> dict:
        nonlocal pulled
        if pulled == len(chunks):
            return {"type": "http.disconnect"}
        pulled += 1
        return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    asyncio.run(app(scope, receive, send))
    return status[0], pulled


@pytest.mark.parametrize("declared", [None, "1000"], ids=["chunked", "lying-content-length"])
def test_an_oversize_body_is_cut_off_as_it_arrives(
    app: FastAPI, release: PrepareResult, small_limits: int, declared: str | None
) -> None:
    """Not read to the end: the app stops pulling once the limit is passed (before sign-in is checked)."""
    body, content_type = multipart("x", b"x" * 400_000, release.key_path.read_bytes())
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]
    headers = {"content-type": content_type} | ({"content-length": declared} if declared else {})
    status, pulled = asgi_post(app, "/dyepack/benchmarks/1/runs", chunks, headers)
    assert status == 413 and pulled <= small_limits // 4096 + 2 < len(chunks)


def test_a_declared_oversize_body_is_not_read_at_all(app: FastAPI, small_limits: int) -> None:
    headers = {"content-type": "multipart/form-data; boundary=b", "content-length": str(small_limits + 1)}
    status, pulled = asgi_post(app, "/dyepack/benchmarks/1/runs", [b"x"] * 10, headers)
    assert (status, pulled) == (413, 0)


def test_oversize_registrations_are_refused_with_413(client: TestClient, release: PrepareResult) -> None:
    csrf = login(client, "olga")
    huge = "x" * (dyepack_routes.MAX_FORM_BYTES + 1)
    page = register(client, csrf, "big", huge)
    assert page.status_code == 413 and "send the commitment, not the release or its key" in page.text
    api = client.post(
        "/api/v1/dyepack/benchmarks", json={"name": "big", "commitment": huge}, headers={"X-CSRF-Token": csrf}
    )
    assert api.status_code == 413 and "larger than the limit of 1 MiB" in api.json()["detail"]
    long_file = register(client, csrf, "long", file=b"#" * (registry.MAX_COMMITMENT_CHARS + 1))
    assert (
        long_file.status_code == 413 and "commitment file: larger than the limit of 10 kB" in long_file.text
    )
    assert 'id="bench-name"' in long_file.text  # the form again
    assert client.get("/api/v1/dyepack/benchmarks").json()["items"] == []


@pytest.mark.slow  # chromium, 6 s
def test_in_a_browser_register_run_and_read_the_verdict(
    app: FastAPI, release: PrepareResult, tmp_path: Path
) -> None:
    """The real forms (multipart uploads, CSRF field), the self-refreshing run page, and no CSP violations."""
    from browser import chromium_page, screenshot  # tests/ is on sys.path
    from web_server import serve_in_thread

    with serve_in_thread(app) as base_url, chromium_page() as page:
        problems: list[str] = []
        page.on(
            "console",
            lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None,
        )
        page.on(
            "response",
            lambda r: problems.append(r.url) if r.status >= 400 and "favicon" not in r.url else None,
        )
        page.goto(f"{base_url}/login?next=/dyepack")
        page.fill("#username", "olga")
        page.fill("#password", PASSWORD)
        page.click("main button[type=submit]")
        page.fill("#bench-name", "mmlu-2026")
        page.fill("#bench-commitment", release.commitment_path.read_text())
        page.click('form[action="/dyepack/benchmarks"] button')
        page.set_input_files("#run-release", str(release.release_path))
        page.set_input_files("#run-key", str(release.key_path))
        page.fill("#run-model", follower(tmp_path, release.key))
        page.click('button:has-text("Start verification")')
        page.wait_for_selector("#verdict", timeout=30_000)
        assert page.inner_text("#verdict-heading") == "Contaminated"
        assert page.inner_text("#fpr") == "0.000244"
        screenshot(page, "dyepack-run")
        assert problems == []
