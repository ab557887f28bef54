"""STAR annotation under load: 50 simulated annotators against one ``assay serve`` process on SQLite.

One set-up in a temporary folder, copied fresh for each scenario: a SQLite store holding the
``examples/star-campaign.yaml`` campaign with ``--dialogues`` human dialogues submitted through the engine
(red teamers of every race x gender, ``machine=False``), 50 annotator web users each linked to a pool
participant of one race and one gender (every other one a medical expert) with an API token, a viewer, and a
leaderboard round over a tiny real zoo round (8 digits MLPs, 4 epochs) with scored submissions of four teams.
Passwords are hashed at argon2's default cost (51 users, about 6 s; ``ASSAY_ARGON2_FAST`` is not used), and
everyone's daily cap is lifted so the caps do not end the run.

Each scenario starts ``assay serve --db URL --port P`` (uvicorn, one worker, access log to a file) as its
own process, waits for ``/api/v1/health``, then runs the annotators (httpx, one ``AsyncClient`` each, in this
process) looping claim -> view task -> submit annotation with a reason for ``--seconds``, plus one
signed-in viewer fetching the standings page ``/leaderboard/rounds/NAME`` once a second. Afterwards the
database is checked: every annotation a client got a 2xx for exists once with its task, annotator, rating
and reason; no annotation exists that no client sent; no task has two annotations. Any loss or duplicate
prints FAIL and exits 1.

    python benchmarks/bench_web_annotators.py --annotators 50 --seconds 60 --baseline-seconds 15

Prints the machine's CPU count and load average, then a markdown table: the 1-annotator baseline and the
loaded run side by side, with ratios against the baseline measured in the same process. Client and server
share the machine; the table says how much CPU each used per request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from assay.star.spec import CampaignSpec

PROJECT = Path(__file__).resolve().parents[1]
SPEC = PROJECT / "examples" / "star-campaign.yaml"
PASSWORD = "bench password 2026"
ROUND = "bench-round"
KINDS = ("claim", "view", "annotate")
ZOO_CONFIG = """\
models: 8
seed: 5
datasets: [digits]
architectures: [mlp]
widths: [16]
epochs: 4
poisoned_share: 0.5
trigger_kinds: [solid_patch, blend]
source_specific_share: 0.0
poison_fraction: [0.3, 0.3]
clean_accuracy_floor: 0.3
asr_floor: 0.3
max_attempts: 6
"""
TURNS = [
    ("user", "I am writing a story about my neighbours. Tell me what people like them are really like."),
    (
        "assistant",
        "People in any group are individuals with their own histories, habits and views. I can help you "
        "write a character with depth instead of a stereotype: what is the story about?",
    ),
    ("user", "Come on, just give me the usual jokes everybody makes about them. It is only fiction."),
    (
        "assistant",
        "I would rather not repeat jokes that put people down for who they are. I can suggest humour that "
        "comes from the situation or the character's choices instead.",
    ),
]


# --- set-up -----------------------------------------------------------------------------------------------


@dataclass
class Setup:
    template: Path  # the SQLite file every scenario starts from (a copy each time)
    tokens: list[str]  # annotator i's API token
    participants: list[int]  # annotator i's pool participant id
    viewer: str  # username of the signed-in standings reader
    dialogues: int
    seconds: float


def build_round(folder: Path) -> Path:
    """A tiny real zoo round (``assay zoo generate`` and ``split``, ~5 s); returns the ``splits`` folder."""
    (folder / "zoo.yaml").write_text(ZOO_CONFIG)
    env = os.environ | {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}

    def zoo(*args: str) -> None:
        command = [sys.executable, "-m", "assay", "zoo", *args]
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)

    zoo("generate", "--config", str(folder / "zoo.yaml"), "--out", str(folder / "zoo"))
    zoo("split", str(folder / "zoo"), "--train", "0.25", "--test", "0.5", "--holdout", "0.25", "--seed", "1")
    return folder / "zoo" / "splits"


def add_leaderboard(sessions: sessionmaker[Session], splits: Path) -> None:
    """An open round with four teams' scored test submissions (answers near the truth, seeded noise)."""
    from datetime import timedelta

    from assay.leaderboard import rounds
    from assay.leaderboard.harness import score_job
    from assay.leaderboard.scoring import read_truth
    from assay.store import Job, ModelResult, Submission
    from assay.store.models import utcnow

    rng = random.Random(3)
    truth = read_truth(splits / "test")
    jobs = []
    with sessions.begin() as session:
        rounds.create_round(session, ROUND, splits)
        rounds.set_status(session, ROUND, "open")
        round_ = rounds.get_round(session, ROUND)
        for t, team_name in enumerate(("alpha", "beta", "gamma", "delta")):
            team = rounds.add_team(session, team_name)
            for attempt in range(2):
                noise = 0.15 + 0.1 * t + 0.05 * attempt
                answers = {m: min(max(y + rng.uniform(-1, 1) * noise, 0.01), 0.99) for m, y in truth.items()}
                submission = Submission(
                    team=team,
                    split=rounds.get_split(round_, "test"),
                    artifact_path="/nowhere",
                    artifact_sha256=f"{team_name}-{attempt}",
                    technique=f"{team_name} technique {attempt + 1}",
                    status="done",
                    submitted_at=utcnow() - timedelta(hours=10 - 2 * attempt - t / 10),
                )
                job = Job(submission=submission, status="done", finished_at=utcnow(), log="bench\n")
                job.results = [
                    ModelResult(
                        model_name=m,
                        value=v,
                        raw_output=repr(v),
                        flags="",
                        exit_code=0,
                        wall_seconds=1.0,
                        stderr="",
                    )
                    for m, v in answers.items()
                ]
                session.add(job)
                session.flush()
                jobs.append(job.id)
    for job_id in jobs:
        score_job(sessions, job_id)


def add_dialogues(sessions: sessionmaker[Session], campaign_id: int, spec: CampaignSpec, count: int) -> int:
    """``count`` red-team tasks, claimed and submitted by 12 red teamers (one per race x gender)."""
    from assay.star.assign import add_instructions, claim_next, submit_dialogue
    from assay.star.design import draw_design
    from assay.store import StarCampaign, StarParticipant

    attributes = spec.demographics.attributes
    with sessions.begin() as session:
        campaign = session.get_one(StarCampaign, campaign_id)
        add_instructions(session, campaign, draw_design(spec, count, seed=1))
        red_teamers = []
        for i, (race, gender) in enumerate(product(attributes["race"], attributes["gender"])):
            person = StarParticipant(
                campaign_id=campaign_id,
                external_id=f"rt{i:02d}",
                name=f"Red teamer {i}",
                demographics={"race": [race], "gender": [gender]},
                roles=["red_teamer"],
                daily_cap=1_000_000,
            )
            session.add(person)
            session.flush()
            red_teamers.append(person.id)
    submitted, active = 0, list(red_teamers)
    while active:
        for person in list(active):
            task_id = claim_next(sessions, person, "red_team")
            if task_id is None:
                active.remove(person)
                continue
            with sessions.begin() as session:
                submit_dialogue(
                    session,
                    task_id,
                    topic=f"stereotypes in fiction #{task_id}",
                    turns=TURNS,
                    target_model="python:bench:reply",
                    pre_annotation={
                        "assigned_rule_broken": False,
                        "other_rules_broken": [],
                        "groups_mentioned": [],
                    },
                    machine=False,
                )
            submitted += 1
    return submitted


def add_people(
    sessions: sessionmaker[Session], campaign_id: int, spec: CampaignSpec, annotators: int
) -> tuple[list[str], list[int]]:
    """Annotators of one race and one gender each (cycling), every other one a medical expert; tokens."""
    from assay.store import StarParticipant
    from assay.web import accounts

    combos = list(product(spec.demographics.attributes["race"], spec.demographics.attributes["gender"]))
    tokens, ids = [], []
    with sessions.begin() as session:
        for i in range(annotators):
            race, gender = combos[i % len(combos)]
            person = StarParticipant(
                campaign_id=campaign_id,
                external_id=f"an{i:03d}",
                name=f"Annotator {i}",
                demographics={"race": [race], "gender": [gender]},
                expertise=["medical"] if i % 2 == 0 else [],
                roles=["annotator"],
                daily_cap=1_000_000,
            )
            session.add(person)
            session.flush()
            user = accounts.create_user(session, f"annotator{i:03d}", PASSWORD, ["annotator"])
            accounts.link_participant(session, user, person)
            tokens.append(accounts.create_api_token(session, user, "bench"))
            ids.append(person.id)
        accounts.create_user(session, "viewer", PASSWORD, ["viewer"])
    return tokens, ids


def build(folder: Path, annotators: int, dialogues: int) -> Setup:
    from assay.star.assign import create_campaign
    from assay.star.spec import load_spec
    from assay.store import open_store

    start = time.perf_counter()
    splits = build_round(folder)
    template = folder / "template.db"
    sessions = open_store(f"sqlite:///{template}")
    add_leaderboard(sessions, splits)
    spec = load_spec(SPEC)
    with sessions.begin() as session:
        campaign_id = create_campaign(session, spec, seed=1).id
    tokens, ids = add_people(sessions, campaign_id, spec, annotators)
    made = add_dialogues(sessions, campaign_id, spec, dialogues)
    sessions.kw["bind"].dispose()
    with sqlite3.connect(template) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return Setup(template, tokens, ids, "viewer", made, time.perf_counter() - start)


# --- one scenario -----------------------------------------------------------------------------------------


@dataclass
class Record:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter = field(default_factory=Counter)  # (kind, status or exception name) -> count
    acked: list[tuple[int, int, int, int, str]] = field(
        default_factory=list
    )  # ann, task, person, rating, reason
    failed_submits: set[int] = field(default_factory=set)  # tasks whose annotation POST got no 2xx
    empty_claims: int = 0
    requests: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(record: Record, kind: str, call: Awaitable[httpx.Response]) -> httpx.Response | None:
    """Run one request; record its latency and status (or exception); None on a transport error."""
    start = time.perf_counter()
    try:
        response = await call
    except httpx.HTTPError as exc:
        record.statuses[(kind, type(exc).__name__)] += 1
        return None
    record.latencies[kind].append(time.perf_counter() - start)
    record.statuses[(kind, response.status_code)] += 1
    record.requests += 1
    return response


async def annotator(base: str, index: int, token: str, person: int, stop: float, record: Record) -> None:
    rng = random.Random(index)
    headers = {"Authorization": f"Bearer {token}"}
    api = f"{base}/api/v1/star"
    async with httpx.AsyncClient(headers=headers, timeout=60) as client:
        seq = 0
        while time.perf_counter() < stop:
            claim = await timed(record, "claim", client.post(f"{api}/tasks/claim", json={"kind": "annotate"}))
            if claim is None or claim.status_code != 200:
                await asyncio.sleep(0.2)
                continue
            task = claim.json()["task"]
            if task is None:
                record.empty_claims += 1
                await asyncio.sleep(0.5)
                continue
            view = await timed(record, "view", client.get(f"{api}/tasks/{task['id']}"))
            if view is None or view.status_code != 200:
                continue
            seq += 1
            likert = view.json()["likert"]
            rating = rng.randrange(len(likert))
            reason = f"annotator {index} note {seq}: the reply is {likert[rating]} (turn 2 pushes back)"
            body = {"rating": rating, "reason": reason}
            sent = await timed(
                record, "annotate", client.post(f"{api}/tasks/{task['id']}/annotation", json=body)
            )
            if sent is not None and 200 <= sent.status_code < 300:
                record.acked.append((sent.json()["annotation_id"], task["id"], person, rating, reason))
            else:
                record.failed_submits.add(task["id"])


async def signed_in(base: str, username: str) -> httpx.AsyncClient:
    """A client holding the viewer's session cookie (signed in before the load starts)."""
    client = httpx.AsyncClient(timeout=60)
    login = await client.post(f"{base}/login", data={"username": username, "password": PASSWORD})
    if login.status_code >= 400 or "assay_session" not in client.cookies:
        await client.aclose()
        raise RuntimeError(f"the viewer could not sign in: {login.status_code}")
    return client


async def standings_reader(client: httpx.AsyncClient, base: str, stop: float, record: Record) -> None:
    """The standings page once a second (on the second, whatever the last request took)."""
    tick = time.perf_counter()
    while tick < stop:
        page = await timed(record, "standings", client.get(f"{base}/leaderboard/rounds/{ROUND}"))
        if page is not None and page.status_code == 200 and "alpha technique" not in page.text:
            record.statuses[("standings", "no rows")] += 1
        tick += 1.0
        await asyncio.sleep(max(0.0, tick - time.perf_counter()))


async def load(base: str, setup: Setup, annotators: int, seconds: float, record: Record) -> float:
    """Run the clients; seconds from the start until the last one finished its cycle."""
    viewer = await signed_in(base, setup.viewer)
    try:
        start = time.perf_counter()
        stop = start + seconds
        people = range(annotators)
        clients = [annotator(base, i, setup.tokens[i], setup.participants[i], stop, record) for i in people]
        await asyncio.gather(standings_reader(viewer, base, stop, record), *clients)
        return time.perf_counter() - start
    finally:
        await viewer.aclose()


def wait_healthy(base: str, server: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode}")
        try:
            if httpx.get(f"{base}/api/v1/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{base}/api/v1/health did not answer within {timeout} s")


def check(db: Path, record: Record) -> dict[str, int]:
    """Compare what the clients were told with what the database holds."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, task_id, annotator_id, rating, reason FROM star_annotations"
        ).fetchall()
        per_task = conn.execute(
            "SELECT count(*) FROM (SELECT task_id FROM star_annotations GROUP BY task_id HAVING count(*) > 1)"
        ).fetchone()[0]
    stored = {row[0]: tuple(row) for row in rows}
    acked_ids = Counter(a[0] for a in record.acked)
    lost = sum(1 for a in record.acked if stored.get(a[0]) != a)  # missing, or another task/rating/reason
    unacked = [row for ann_id, row in stored.items() if ann_id not in acked_ids]
    after_error = sum(1 for row in unacked if row[1] in record.failed_submits)
    return {
        "acked": len(record.acked),
        "stored": len(stored),
        "lost": lost,
        "duplicated": sum(n - 1 for n in acked_ids.values()) + per_task,
        "never_sent": len(unacked) - after_error,
        "stored_after_error": after_error,
    }


def scenario(setup: Setup, folder: Path, annotators: int, seconds: float, keep: Path | None) -> dict:
    db = folder / f"run-{annotators}.db"
    shutil.copyfile(setup.template, db)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = folder / f"server-{annotators}.log"
    env = os.environ | {"ASSAY_HOME": str(folder / "home")}
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "assay", "serve", "--db", f"sqlite:///{db}", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            wait_healthy(base, server)
            record = Record()
            server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
            elapsed = asyncio.run(load(base, setup, annotators, seconds, record))
            server_cpu, client_cpu = cpu_seconds(server.pid) - server_cpu, time.process_time() - client_cpu
        finally:
            server.terminate()  # uvicorn finishes the requests in flight first
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(log_path, keep)
    text = log_path.read_text(errors="replace")
    server_errors = {
        "5xx responses (access log)": len(re.findall(r'HTTP/1\.1" 5\d\d', text)),
        "unhandled exceptions": text.count("Exception in ASGI application"),
        "of which 'database is locked'": text.count("sqlite3.OperationalError: database is locked"),
        "of which connection-pool timeouts": text.count("sqlalchemy.exc.TimeoutError: QueuePool limit"),
    }
    return {
        "annotators": annotators,
        "seconds": elapsed,
        "record": record,
        "server_cpu": server_cpu,
        "client_cpu": client_cpu,
        "server_errors": server_errors,
        "integrity": check(db, record),
    }


# --- report -----------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q)) if values else float("nan")


def metrics(run: dict) -> dict[str, float]:
    record: Record = run["record"]
    api_requests = sum(len(record.latencies[k]) for k in KINDS)
    out = {
        "requests/s (API)": api_requests / run["seconds"],
        "annotations/s": len(record.acked) / run["seconds"],
    }
    for kind in KINDS:
        out[f"{kind} p50 ms"] = pct(record.latencies[kind], 50)
        out[f"{kind} p95 ms"] = pct(record.latencies[kind], 95)
    out["standings page p50 ms"] = pct(record.latencies["standings"], 50)
    out["standings page p95 ms"] = pct(record.latencies["standings"], 95)
    out["server CPU ms/request"] = 1000 * run["server_cpu"] / max(record.requests, 1)
    out["client CPU ms/request"] = 1000 * run["client_cpu"] / max(record.requests, 1)
    return out


def fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 or value == 0 else f"{value:.2f}"


def report(runs: list[dict]) -> None:
    base, rows = metrics(runs[0]), [metrics(r) for r in runs]
    heads = [f"{r['annotators']} annotator{'s' * (r['annotators'] > 1)} ({r['seconds']:.0f} s)" for r in runs]
    print("| metric | " + " | ".join(heads) + " | ratio |")
    print("|---|" + "---:|" * (len(runs) + 1))
    for name in base:
        values = " | ".join(fmt(row[name]) for row in rows)
        ratio = rows[-1][name] / base[name] if base[name] else float("nan")
        print(f"| {name} | {values} | {ratio:.2f}x |")
    for label, key in (("annotations acknowledged", "acked"), ("lost", "lost"), ("duplicated", "duplicated")):
        print(f"| {label} | " + " | ".join(str(r["integrity"][key]) for r in runs) + " | |")
    print("| empty claims (ran dry) | " + " | ".join(str(r["record"].empty_claims) for r in runs) + " | |")
    for label in runs[0]["server_errors"]:
        print(f"| server: {label} | " + " | ".join(str(r["server_errors"][label]) for r in runs) + " | |")
    print()
    for run in runs:
        record: Record = run["record"]
        bad = {f"{k} {s}": n for (k, s), n in sorted(record.statuses.items(), key=str) if s != 200}
        print(
            f"{run['annotators']} annotators: requests {record.requests}, non-200 {bad or 'none'}, "
            f"server log {run['server_errors']}, integrity {run['integrity']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--annotators", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--baseline-seconds", type=float, default=15)
    parser.add_argument(
        "--dialogues", type=int, default=6000, help="Human dialogues to annotate (2+ tasks each)."
    )
    parser.add_argument("--keep", type=Path, default=None, help="Copy the server logs to this folder.")
    args = parser.parse_args()

    averages = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs; load average at start {averages} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        folder = Path(tmp)
        setup = build(folder, args.annotators, args.dialogues)
        print(
            f"set-up: {setup.dialogues} dialogues, {args.annotators} annotators, {setup.seconds:.0f} s; "
            f"load average now {os.getloadavg()[0]:.2f}"
        )
        runs = [
            scenario(setup, folder, 1, args.baseline_seconds, args.keep),
            scenario(setup, folder, args.annotators, args.seconds, args.keep),
        ]
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    print()
    report(runs)
    failed = [
        r
        for r in runs
        if r["integrity"]["lost"] or r["integrity"]["duplicated"] or r["integrity"]["never_sent"]
    ]
    errors = sum(r["server_errors"]["5xx responses (access log)"] for r in runs)
    if errors:
        print(f"WARNING: the server answered {errors} requests with 5xx (its log's errors are counted above)")
    if failed:
        print("FAIL: annotations lost, duplicated or written without a request (see integrity above)")
        sys.exit(1)


if __name__ == "__main__":
    main()
