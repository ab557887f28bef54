"""A detector written to NIST's trojai-example conventions runs unmodified on a zoo round.

The detector folder is NIST's entrypoint.py and utils/ byte for byte (``examples/trojai-baseline/``, the
published usnistgov/trojai-example branch baseline-example, checked against upstream's git blob ids in
``examples/trojai-baseline.json``) and ``nist_example/``: a detector.py in NIST's style (bare
``torch.load`` of the model, ``config.json`` read beside it), the NIST schema layout (technique fields at
the root, nothing required), and a classifier fitted on the round's training dataset. Nothing of assay is
imported by it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from assay.errors import UserError
from assay.leaderboard import rounds, submissions
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.store import Job, open_store

OURS = Path(__file__).parent / "nist_example"
BASELINE = Path(__file__).parents[2] / "examples" / "trojai-baseline"
UPSTREAM = json.loads((BASELINE.parent / "trojai-baseline.json").read_text())["files"]
NISTS = ("entrypoint.py", "utils")  # what the detector takes from NIST's example as it is

pytestmark = pytest.mark.slow


def _blob_id(path: Path) -> str:
    """git's id of a file's bytes (``git hash-object``), as upstream's tree names them."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def detector_folder(dest: Path) -> Path:
    """NIST's entrypoint.py and utils/ beside our NIST-style detector.py, metaparameters and schema."""
    shutil.copytree(OURS, dest)
    for name in NISTS:
        source = BASELINE / name
        shutil.copytree(source, dest / name) if source.is_dir() else shutil.copy(source, dest / name)
    return dest


def test_the_baseline_files_are_nists_own():
    assert len(UPSTREAM) == 12
    for name, blob in UPSTREAM.items():
        assert _blob_id(BASELINE / name) == blob, name


@pytest.fixture
def nist_board(small_round: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    url = f"sqlite:///{tmp_path / 'board.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(session, "nist", small_round / "splits", per_model_timeout_s=120)
        rounds.set_status(session, "nist", "open")
        rounds.add_team(session, "performer")
    return sessions, tmp_path / "artifacts"


def _run(sessions, artifacts: Path, folder: Path, split: str) -> Job:
    with sessions.begin() as session:
        submissions.submit(session, artifacts, "performer", "nist", split, folder)
    work(sessions, LocalExecutor(2), once=True)
    with sessions() as session:
        job = session.scalars(select(Job).order_by(Job.id.desc())).first()
        assert job is not None
        job_results = [(r.model_name, r.value, r.flags, r.exit_code, r.stderr) for r in job.results]
        metrics = {m.name: m.value for m in job.metrics if not m.group_column}
        return (job.status, job.log), job_results, metrics


def test_unmodified_nist_style_detector_scores_on_a_zoo_round(nist_board, small_round: Path, tmp_path: Path):
    sessions, artifacts = nist_board
    folder = detector_folder(tmp_path / "detector")
    (status, log), results, metrics = _run(sessions, artifacts, folder, "test")
    assert status == "done", log
    test_models = sorted(p.name for p in (small_round / "splits" / "test-sequestered" / "models").iterdir())
    assert sorted(name for name, *_ in results) == test_models
    for _, value, flags, exit_code, stderr in results:
        assert flags == "" and exit_code == 0, stderr[-1500:]
        assert 0.0 <= value <= 1.0
        # the detector fitted on every model of the round's training split, read through the staged path
        train = len(list((small_round / "splits" / "train" / "models").iterdir()))
        assert f"Fitted on {train} models" in stderr
    assert len({value for _, value, *_ in results}) > 1  # an answer per model, not a constant
    assert math.isfinite(metrics["cross_entropy"]) and 0 <= metrics["roc_auc"] <= 1


def test_configure_then_infer_with_learned_parameters(nist_board, small_round: Path, tmp_path: Path):
    """NIST's configure path: --configure_models_dirpath is the folder of id-* models (train/models)."""
    sessions, artifacts = nist_board
    folder = detector_folder(tmp_path / "detector")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    configure = [
        sys.executable,
        "entrypoint.py",
        "configure",
        *("--scratch_dirpath", str(scratch)),
        *("--metaparameters_filepath", "metaparameters.json"),
        *("--schema_filepath", "metaparameters_schema.json"),
        *("--learned_parameters_dirpath", "learned_parameters"),
        *("--configure_models_dirpath", str(small_round / "splits" / "train" / "models")),
    ]
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    done = subprocess.run(configure, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (folder / "learned_parameters" / "model.bin").is_file()
    (status, log), results, _ = _run(sessions, artifacts, folder, "smoke")
    assert status == "done", log
    for *_, flags, exit_code, stderr in results:
        assert flags == "" and exit_code == 0, stderr[-1500:]
        assert "Fitted on" not in stderr  # learned parameters were used


def test_the_infer_word_is_a_round_setting(small_round: Path, tmp_path: Path, monkeypatch):
    """A round may call detectors with the word (older assay rounds did); NIST's entrypoint takes both."""
    url = f"sqlite:///{tmp_path / 'board.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    source = tmp_path / "source-data"
    source.mkdir()
    (source / "README.txt").write_text("the source data set\n")
    with sessions.begin() as session:
        made = rounds.create_round(
            session, "worded", small_round / "splits", infer_word=True, source_dataset=source
        )
        assert made.infer_word and made.source_dataset == str(source.resolve())
        rounds.set_status(session, "worded", "open")
        rounds.add_team(session, "performer")
    probe = detector_folder(tmp_path / "probe")
    # NIST's baseline entrypoint has no --source_dataset_dirpath (its rounds with source data do): a probe
    (probe / "entrypoint.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps(sys.argv[1:]))\n"
        "source = sys.argv[sys.argv.index('--source_dataset_dirpath') + 1]\n"
        "print(sorted(os.listdir(source)))\n"
        "open(sys.argv[sys.argv.index('--result_filepath') + 1], 'w').write('0.5')\n"
    )
    with sessions.begin() as session:
        submissions.submit(session, tmp_path / "artifacts", "performer", "worded", "smoke", probe)
    work(sessions, LocalExecutor(1), once=True)
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        lines = job.results[0].stdout.strip().splitlines()
    argv = json.loads(lines[0])
    assert argv[0] == "infer"
    assert lines[1] == "['README.txt']"
    assert argv[argv.index("--source_dataset_dirpath") + 1].endswith("source-dataset")
    with sessions.begin() as session, pytest.raises(UserError, match="--metric"):
        rounds.create_round(session, "bad", small_round / "splits", metric="accuracy")
