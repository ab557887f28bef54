"""STAR annotation under load: simulated annotators against ``assay serve`` on SQLite or PostgreSQL, with
one or several worker processes, with or without think time.

One set-up in a temporary folder, copied fresh for each scenario: a SQLite store holding the
``examples/star-campaign.yaml`` campaign with ``--dialogues`` human dialogues submitted through the engine
(red teamers of every race x gender, ``machine=False``), 50 annotator web users each linked to a pool
participant of one race and one gender (every other one a medical expert) with an API token, a viewer, and a
leaderboard round over a tiny real zoo round (8 digits MLPs, 4 epochs) with scored submissions of four teams.
Passwords are hashed at argon2's default cost (51 users, about 6 s; ``ASSAY_ARGON2_FAST`` is not used), and
everyone's daily cap is lifted so the caps do not end the run.

Each scenario starts ``assay serve --db URL --port P`` (uvicorn, one worker, access log to a file) as its
own process, waits for ``/api/v1/health``, then runs the annotators (aiohttp, one ``ClientSession`` each, in
this process, which shares the cores with the server: aiohttp costs less client CPU per request than httpx)
looping claim -> view task -> submit annotation with a reason for ``--seconds``, plus one signed-in viewer
(httpx) fetching the standings page ``/leaderboard/rounds/NAME`` once a second. Afterwards the database
is checked: every annotation a client got a 2xx for exists once with its task, annotator, rating
and reason; no annotation exists that no client sent; no task has two annotations. Any loss or duplicate
prints FAIL and exits 1.

    python benchmarks/bench_web_annotators.py --annotators 50 --seconds 60 --baseline-seconds 15
    python benchmarks/bench_web_annotators.py --db postgresql --workers 1 2 4 --annotators 200 \
        --think-median 6 --seconds 60
    # issue 27's crowd goals in about 5-7 minutes: think time at 2 workers, the stress case at 1, 2 and 4
    python benchmarks/bench_web_annotators.py --db postgresql --annotators 200 --workers 2 \
        --stress-workers 1 2 4 --think-median 6 --seconds 30 --baseline-seconds 5 --dialogues 800

``--db postgresql`` starts a throwaway PostgreSQL server (``tests/postgres.py``: its own cluster on
127.0.0.1, fsync off) and gives each scenario a fresh database copied from the set-up's (``CREATE DATABASE
... TEMPLATE``). ``--workers`` runs the loaded scenario once per worker count (``assay serve --workers N``).
``--think-median S`` makes each annotator pause between a task's view and its rating, and between tasks, for
a log-normal time with median S seconds (sigma ``--think-sigma``, 0.8 by default: most pauses within a
factor of 2.2 of the median, a few much longer), as people reading a dialogue do; each worker count is then
run twice, with think time and without (the stress case); ``--stress-workers`` picks other worker counts for
the stress case. A pause never runs past the end of the run. ``--ramp S`` spreads the annotators' arrival over
S seconds (default: all at once, the hardest first minute). Server CPU counts the uvicorn process and its
workers. The server's threads and connections per worker follow ``ASSAY_WEB_THREADS`` (``docs/deploy.md``).
``--profile DIR`` runs the server under py-spy (``pip install py-spy``; not installed by the Makefile) and
writes each scenario's collapsed stacks to ``DIR/run_*.txt``; its timings are then not comparable.

Prints the machine's CPU count and load average, then a markdown table: the 1-annotator baseline and the
loaded run side by side, with ratios against the baseline measured in the same process, the load average
after each, and the goals: worst route p95 over the run and its first minute, 5xx, and the stress case's
requests/s at each worker count against one worker. Client and server share the machine; the table says
how much CPU each used per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the throwaway PostgreSQL
from postgres import PostgresServer, postgres_server

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from assay.star.spec import CampaignSpec

PROJECT = Path(__file__).resolve().parents[1]
SPEC = PROJECT / "examples" / "star-campaign.yaml"
PASSWORD = "bench password 2026"
ROUND = "bench-round"
KINDS = ("claim", "view", "annotate")
ROUTES = (*KINDS, "standings")
EARLY = 60.0  # seconds: the first minute, when every annotator arrives, is reported on its own
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
    template: str  # the set-up's database every scenario starts from (a copy each time): a file or a name
    tokens: list[str]  # annotator i's API token
    participants: list[int]  # annotator i's pool participant id
    viewer: str  # username of the signed-in standings reader
    dialogues: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds per part of the set-up


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
    shared_hash = accounts.hash_password(PASSWORD)  # annotators use tokens: one hash for all of them
    real_hash, accounts.hash_password = accounts.hash_password, lambda _password: shared_hash
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
        accounts.hash_password = real_hash
        accounts.create_user(session, "viewer", PASSWORD, ["viewer"])  # signs in: its own hash, default cost
    return tokens, ids


def build(folder: Path, annotators: int, dialogues: int, postgres: PostgresServer | None) -> Setup:
    from assay.star.assign import create_campaign
    from assay.star.spec import load_spec
    from assay.store import open_store

    start = time.perf_counter()
    splits = build_round(folder)
    phases = {"zoo round": time.perf_counter() - start}
    if postgres is not None:
        template = "bench_template"
        postgres_sql(postgres, f'CREATE DATABASE "{template}"')
        url = postgres.url(template)
    else:
        template = str(folder / "template.db")
        url = f"sqlite:///{template}"
    sessions = open_store(url)
    add_leaderboard(sessions, splits)
    spec = load_spec(SPEC)
    with sessions.begin() as session:
        campaign_id = create_campaign(session, spec, seed=1).id
    mark = time.perf_counter()
    tokens, ids = add_people(sessions, campaign_id, spec, annotators)
    phases["people"] = time.perf_counter() - mark
    mark = time.perf_counter()
    made = add_dialogues(sessions, campaign_id, spec, dialogues)
    phases["dialogues"] = time.perf_counter() - mark
    sessions.kw["bind"].dispose()
    if postgres is None:
        with sqlite3.connect(template) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return Setup(template, tokens, ids, "viewer", made, time.perf_counter() - start, phases)


def postgres_sql(server: PostgresServer, statement: str) -> None:
    import psycopg

    with psycopg.connect(
        f"host=127.0.0.1 port={server.port} user=assay dbname=postgres", autocommit=True
    ) as c:
        c.execute(statement)


def fresh_database(setup: Setup, folder: Path, name: str, postgres: PostgresServer | None) -> str:
    """A copy of the set-up's database for one scenario; its SQLAlchemy URL."""
    if postgres is None:
        db = folder / f"{name}.db"
        shutil.copyfile(setup.template, db)
        return f"sqlite:///{db}"
    postgres_sql(postgres, f'CREATE DATABASE "{name}" TEMPLATE "{setup.template}"')
    return postgres.url(name)


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
    t0: float = 0.0  # when the load started (perf_counter)
    early: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # started in EARLY
    finished: list[float] = field(default_factory=list)  # API requests: seconds from t0 to their answer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                if int(_stat(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process and its live children (uvicorn's workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat(int(entry.name))
            except OSError:
                continue
            if int(entry.name) == pid or int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


@dataclass(frozen=True)
class Reply:
    """What an annotator reads of a response (httpx's names, so the viewer's httpx client reads alike)."""

    status_code: int
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


async def send(session: aiohttp.ClientSession, method: str, url: str, **options: object) -> Reply:
    async with session.request(method, url, **options) as response:
        return Reply(response.status, await response.read())


TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError, asyncio.TimeoutError)


async def timed(
    record: Record, kind: str, call: Awaitable[Reply | httpx.Response]
) -> Reply | httpx.Response | None:
    """Run one request; record its latency and status (or exception); None on a transport error."""
    start = time.perf_counter()
    try:
        response = await call
    except TRANSPORT_ERRORS as exc:
        record.statuses[(kind, type(exc).__name__)] += 1
        return None
    record.latencies[kind].append(time.perf_counter() - start)
    if kind in KINDS:
        record.finished.append(time.perf_counter() - record.t0)
    if start - record.t0 < EARLY:
        record.early[kind].append(time.perf_counter() - start)
    record.statuses[(kind, response.status_code)] += 1
    record.requests += 1
    return response


async def annotator(
    base: str, index: int, token: str, person: int, stop: float, record: Record, think: Think
) -> None:
    rng = random.Random(index)
    headers = {"Authorization": f"Bearer {token}"}
    api = f"{base}/api/v1/star"
    await asyncio.sleep(rng.uniform(0.0, think.ramp))  # arriving: 0 is everyone in the same instant
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as client:
        seq = 0
        while time.perf_counter() < stop:
            claim = await timed(
                record, "claim", send(client, "POST", f"{api}/tasks/claim", json={"kind": "annotate"})
            )
            if claim is None or claim.status_code != 200:
                await asyncio.sleep(0.2)
                continue
            task = claim.json()["task"]
            if task is None:
                record.empty_claims += 1
                await asyncio.sleep(0.5)
                continue
            view = await timed(record, "view", send(client, "GET", f"{api}/tasks/{task['id']}"))
            if view is None or view.status_code != 200:
                continue
            seq += 1
            if not await think.pause(rng, stop):  # reading the dialogue; the run ends mid-read
                return
            likert = view.json()["likert"]
            rating = rng.randrange(len(likert))
            reason = f"annotator {index} note {seq}: the reply is {likert[rating]} (turn 2 pushes back)"
            body = {"rating": rating, "reason": reason}
            sent = await timed(
                record, "annotate", send(client, "POST", f"{api}/tasks/{task['id']}/annotation", json=body)
            )
            if sent is not None and 200 <= sent.status_code < 300:
                record.acked.append((sent.json()["annotation_id"], task["id"], person, rating, reason))
            else:
                record.failed_submits.add(task["id"])
            await think.pause(rng, stop)  # between tasks


@dataclass(frozen=True)
class Think:
    """Pauses of people at work: log-normal with this median (seconds; 0: none) and sigma; each annotator
    arrives at a uniformly random moment in the first ``ramp`` seconds (0: all at once)."""

    median: float = 0.0
    sigma: float = 0.8
    ramp: float = 0.0

    async def pause(self, rng: random.Random, stop: float) -> bool:
        """Pause, but not past ``stop`` (a 40 s pause would keep the run going); False if it got there."""
        if self.median <= 0:
            return True
        wanted = self.median * float(np.exp(rng.gauss(0.0, self.sigma)))
        left = stop - time.perf_counter()
        await asyncio.sleep(max(0.0, min(wanted, left)))
        return wanted < left


async def signed_in(base: str, username: str) -> httpx.AsyncClient:
    """A client holding the viewer's session cookie (signed in through the form before the load starts)."""
    client = httpx.AsyncClient(timeout=60)
    form = await client.get(f"{base}/login")
    token = re.search(r'name="login_token" value="([^"]+)"', form.text)
    data = {"username": username, "password": PASSWORD, "login_token": token.group(1) if token else ""}
    login = await client.post(f"{base}/login", data=data)
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


async def load(
    base: str, setup: Setup, annotators: int, seconds: float, record: Record, think: Think
) -> float:
    """Run the clients; seconds from the start until the last one finished its cycle."""
    viewer = await signed_in(base, setup.viewer)
    try:
        start = record.t0 = time.perf_counter()
        stop = start + seconds
        people = range(annotators)
        clients = [
            annotator(base, i, setup.tokens[i], setup.participants[i], stop, record, think) for i in people
        ]
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


def check(url: str, record: Record) -> dict[str, int]:
    """Compare what the clients were told with what the database holds."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, task_id, annotator_id, rating, reason FROM star_annotations")
        ).all()
        per_task = conn.execute(
            text(
                "SELECT count(*) FROM (SELECT task_id FROM star_annotations"
                " GROUP BY task_id HAVING count(*) > 1) AS doubled"
            )
        ).scalar_one()
    engine.dispose()
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


@dataclass(frozen=True)
class Plan:
    """One scenario: how many annotators, for how long, on how many workers, with what pauses."""

    annotators: int
    seconds: float
    workers: int = 1
    think: Think = Think()

    @property
    def label(self) -> str:
        pauses = f"think {self.think.median:g} s" if self.think.median else "no think"
        pauses += f", arriving over {self.think.ramp:g} s" if self.think.ramp else ""
        return f"{self.annotators} ann., {self.workers} worker{'s' * (self.workers > 1)}, {pauses}"


def scenario(
    setup: Setup,
    folder: Path,
    plan: Plan,
    keep: Path | None,
    postgres: PostgresServer | None,
    profile: Path | None = None,
) -> dict:
    name = f"run_{plan.annotators}_{plan.workers}_{int(plan.think.median * 10)}"
    url = fresh_database(setup, folder, name, postgres)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = folder / f"server-{name}.log"
    env = os.environ | {"ASSAY_HOME": str(folder / "home")}
    argv = [sys.executable, "-m", "assay", "serve", "--db", url, "--port", str(port)]
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        out = profile / f"{name}.txt"
        argv = [
            str(spy),
            "record",
            "--subprocesses",
            "--format",
            "raw",
            "-r",
            "200",
            "-o",
            str(out),
            "--",
            *argv,
        ]
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [*argv, "--workers", str(plan.workers)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        try:
            wait_healthy(base, server)
            if plan.workers > 1:
                time.sleep(3)  # every worker has started and opened the store
            record = Record()
            server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
            elapsed = asyncio.run(load(base, setup, plan.annotators, plan.seconds, record, plan.think))
            server_cpu, client_cpu = cpu_seconds(server.pid) - server_cpu, time.process_time() - client_cpu
        finally:
            # uvicorn finishes the requests in flight first; under py-spy, stopping the server (py-spy's
            # child) makes py-spy write its profile and exit, where a signal to py-spy would lose it
            for pid in children(server.pid) if profile is not None else [server.pid]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
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
        "annotators": plan.annotators,
        "workers": plan.workers,
        "think": plan.think.median > 0,
        "load": os.getloadavg()[0],
        "label": plan.label,
        "seconds": elapsed,
        "window": plan.seconds,
        "record": record,
        "server_cpu": server_cpu,
        "client_cpu": client_cpu,
        "server_errors": server_errors,
        "integrity": check(url, record),
    }


# --- report -----------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q)) if values else float("nan")


def metrics(run: dict) -> dict[str, float]:
    record: Record = run["record"]
    api_requests = sum(len(record.latencies[k]) for k in KINDS)
    out = {
        "requests/s (API)": api_requests / run["seconds"],
        # Saturated throughput in the steady part of the run: answers from a fifth of the window (every
        # client under way) to its end; the drain after it (clients finishing their last cycle, fewer and
        # fewer in flight) would count a slow configuration's tail against it.
        "requests/s (API, steady window)": sum(
            0.2 * run["window"] <= t <= run["window"] for t in record.finished
        )
        / (0.8 * run["window"]),
        "annotations/s": len(record.acked) / run["seconds"],
    }
    for kind in KINDS:
        out[f"{kind} p50 ms"] = pct(record.latencies[kind], 50)
        out[f"{kind} p95 ms"] = pct(record.latencies[kind], 95)
    out["standings page p50 ms"] = pct(record.latencies["standings"], 50)
    out["standings page p95 ms"] = pct(record.latencies["standings"], 95)
    out["worst route p95 ms"] = max(pct(record.latencies[k], 95) for k in ROUTES if record.latencies[k])
    early = [pct(record.early[k], 95) for k in ROUTES if record.early[k]]
    out[f"worst route p95 ms, first {EARLY:g} s"] = max(early) if early else float("nan")
    out["server CPU ms/request"] = 1000 * run["server_cpu"] / max(record.requests, 1)
    out["client CPU ms/request"] = 1000 * run["client_cpu"] / max(record.requests, 1)
    return out


def fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 or value == 0 else f"{value:.2f}"


def report(runs: list[dict]) -> None:
    base, rows = metrics(runs[0]), [metrics(r) for r in runs]
    heads = [f"{r['label']} ({r['seconds']:.0f} s)" for r in runs]
    print("| metric | " + " | ".join(heads) + " | last / first |")
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
    print("| load average (1 min) after | " + " | ".join(f"{r['load']:.2f}" for r in runs) + " | |")
    print()
    for run in runs:
        record: Record = run["record"]
        bad = {f"{k} {s}": n for (k, s), n in sorted(record.statuses.items(), key=str) if s != 200}
        print(
            f"{run['label']}: requests {record.requests}, non-200 {bad or 'none'}, "
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
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="Run the server under py-spy (pip install py-spy) and write one collapsed-stack file per "
        "scenario to this folder (where the server's CPU per request goes).",
    )
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1], help="Worker counts to run under load."
    )
    parser.add_argument("--think-median", type=float, default=0.0, help="Median pause in seconds (0: none).")
    parser.add_argument("--think-sigma", type=float, default=0.8)
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="With think time: annotators arrive at random moments over this many seconds (0: all at once).",
    )
    parser.add_argument(
        "--stress-workers",
        type=int,
        nargs="*",
        default=None,
        help="Worker counts for the runs without think time (default: --workers; none: skip them).",
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        postgres = stack.enter_context(postgres_server()) if args.db == "postgresql" else None
        run_all(args, postgres)


def plans_of(args: argparse.Namespace) -> list[Plan]:
    """The 1-annotator baseline, then per worker count the run with think time and the stress run."""
    think = Think(args.think_median, args.think_sigma, args.ramp)
    stress = args.workers if args.stress_workers is None else args.stress_workers
    plans = [Plan(1, args.baseline_seconds, args.workers[0])]
    for workers in sorted(set(args.workers) | set(stress)):
        if args.think_median > 0 and workers in args.workers:
            plans.append(Plan(args.annotators, args.seconds, workers, think))
        if workers in stress or args.think_median <= 0:
            plans.append(Plan(args.annotators, args.seconds, workers))
    return plans


def goals(runs: list[dict]) -> None:
    """Issue 27's crowd goals from this run: worst p95 with think time, 5xx, saturated throughput ratios."""
    print()
    for run in runs[1:]:
        row = metrics(run)
        print(
            f"{run['label']}: worst route p95 {fmt(row['worst route p95 ms'])} ms "
            f"(first {EARLY:g} s: {fmt(row[f'worst route p95 ms, first {EARLY:g} s'])} ms), "
            f"5xx {run['server_errors']['5xx responses (access log)']}, load average {run['load']:.2f}"
        )
    for key in ("requests/s (API)", "requests/s (API, steady window)"):
        stress = {r["workers"]: metrics(r)[key] for r in runs[1:] if not r["think"]}
        if 1 in stress:
            ratios = ", ".join(
                f"{w} workers {v / stress[1]:.2f}x" for w, v in sorted(stress.items()) if w > 1
            )
            print(f"saturated {key} against 1 worker: {ratios or 'no other worker count run'}")


def run_all(args: argparse.Namespace, postgres: PostgresServer | None) -> None:

    averages = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs; load average at start {averages} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        folder = Path(tmp)
        setup = build(folder, args.annotators, args.dialogues, postgres)
        phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in setup.phases.items())
        print(
            f"set-up: {setup.dialogues} dialogues, {args.annotators} annotators, {setup.seconds:.0f} s "
            f"({phases}); load average now {os.getloadavg()[0]:.2f}"
        )
        runs = [scenario(setup, folder, plan, args.keep, postgres, args.profile) for plan in plans_of(args)]
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    print()
    report(runs)
    goals(runs)
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
