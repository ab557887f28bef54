"""Container submissions through the real submission path: image archives (docker-archive, oci-archive) and
``podman:REF`` accepted, stored content-addressed, checked (one image, an entrypoint, size, metaparameters
read out of the image's layers), and a job run end to end on a zoo round by the worker, scored as NIST
would, with the image's own detector reading each model's weights. Singularity ``.sif`` images the same
way with no SIF engine (``assay.runner.sif``): checked without unpacking, and a job scored against the
same detector submitted as a folder.

The submission checks use archives and SIF files written by hand and need no podman (SIF ones need
squashfs-tools); the jobs need podman, or bubblewrap and squashfs-tools for a ``.sif``, and skip where they
are missing (``make install`` installs them).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from assay.errors import UserError
from assay.leaderboard import rounds, submissions
from assay.leaderboard.scoring import read_truth
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.stats import cross_entropy
from assay.store import Job, Submission, open_store
from assay.store.models import Round
from container_image import (
    ENTRYPOINT,
    METAPARAMETERS,
    SCHEMA,
    BuiltImage,
    build_image,
    expected_value,
    handmade_archive,
    podman_ready,
)
from fake_board import fake_splits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))  # the SIF writer's folder
from sif_image import (
    PARTITION,
    SIGNATURE,
    SifObject,
    build_sif,
    partition_extra,
    pgp_signature,
    signature_extra,
    squash,
    write_sif,
)

MISSING = podman_ready()
NO_SQUASHFS = shutil.which("unsquashfs") is None or shutil.which("mksquashfs") is None
ENTRY = ["python3", "/entrypoint.py"]
GOOD_FILES = {
    "entrypoint.py": ENTRYPOINT.encode(),
    "metaparameters.json": json.dumps(METAPARAMETERS).encode(),
    "metaparameters_schema.json": json.dumps(SCHEMA).encode(),
}


def open_board(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An open round over ``dataset`` with two teams, in a SQLite file of the test's own."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(session, "r1", dataset, submission_window_s=3600, per_model_timeout_s=60)
        rounds.set_status(session, "r1", "open")
        for team in ("alpha", "beta"):
            rounds.add_team(session, team)
    return sessions, tmp_path / "artifacts"


@pytest.fixture
def fake_board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return open_board(fake_splits(tmp_path / "splits"), tmp_path, monkeypatch)


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    if MISSING is not None:
        pytest.skip(f"podman: {MISSING}")
    return build_image(tmp_path_factory.mktemp("image"))


def submit(sessions, artifacts: Path, team: str, artifact: Path | str, split: str = "train") -> Submission:
    with sessions.begin() as session:
        made = submissions.submit(session, artifacts, team, "r1", split, artifact)
        session.expunge(made)
        return made


# --- submission checks (no podman needed) -------------------------------------------------------------------


def test_an_image_archive_is_stored_as_sent_and_read_for_its_metaparameters(
    fake_board, tmp_path: Path
) -> None:
    sessions, artifacts = fake_board
    archive = handmade_archive(tmp_path / "detector.tar", [{"bin": b"x"}, GOOD_FILES], ENTRY)
    made = submit(sessions, artifacts, "alpha", archive)
    assert made.status == "queued", made.validation_errors
    assert made.technique == "weight spread"
    stored = Path(made.artifact_path)
    assert [p.name for p in stored.iterdir()] == ["image.tar"]
    assert (stored / "image.tar").read_bytes() == archive.read_bytes()
    assert stored.name == made.artifact_sha256 == submissions.digest(stored)
    assert submissions.stored_image(stored) == str(stored / "image.tar")
    assert made.artifact_bytes == archive.stat().st_size
    # the same bytes again from the same team: a duplicate, not run twice
    assert submit(sessions, artifacts, "alpha", archive).status == "duplicate"


def test_a_detector_tar_with_a_manifest_of_its_own_is_still_a_detector(fake_board, tmp_path: Path) -> None:
    import shutil
    import tarfile

    folder = tmp_path / "constant"
    shutil.copytree(Path(__file__).resolve().parents[2] / "detectors" / "constant", folder)
    (folder / "manifest.json").write_text("[]")
    archive = tmp_path / "constant.tar"
    with tarfile.open(archive, "w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    made = submit(fake_board[0], fake_board[1], "alpha", archive)
    assert made.status == "queued", made.validation_errors
    assert (Path(made.artifact_path) / "entrypoint.py").is_file()
    assert submissions.stored_image(Path(made.artifact_path)) is None


@pytest.mark.parametrize(
    ("layers", "problem"),
    [
        ([{"bin": b"x"}], "/metaparameters.json: missing from the image"),
        ([GOOD_FILES, {".wh.metaparameters_schema.json": b""}], "/metaparameters_schema.json: missing"),
        ([{**GOOD_FILES, "metaparameters.json": b'{"centre": 99}'}], "/metaparameters.json: field 'centre'"),
        ([{**GOOD_FILES, "metaparameters_schema.json": b"{nope"}], "/metaparameters_schema.json:1: "),
    ],
)
def test_bad_metaparameters_in_an_image_reject_it_with_a_reason(
    fake_board, tmp_path: Path, layers: list, problem: str
) -> None:
    sessions, artifacts = fake_board
    made = submit(sessions, artifacts, "alpha", handmade_archive(tmp_path / "bad.tar", layers, ENTRY))
    assert made.status == "rejected", made.validation_errors
    assert any(line.startswith(problem) for line in made.validation_errors.splitlines()), (
        made.validation_errors
    )


def test_malformed_images_are_one_line_errors(
    fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, artifacts = fake_board
    for archive, message in (
        (handmade_archive(tmp_path / "noentry.tar", [GOOD_FILES]), "neither an ENTRYPOINT nor a CMD"),
        (handmade_archive(tmp_path / "two.tar", [GOOD_FILES], ENTRY, images=2), "holds 2 images"),
    ):
        with pytest.raises(UserError, match=message) as caught:
            submit(sessions, artifacts, "alpha", archive)
        assert "\n" not in str(caught.value)
    # the archive within the round's image limit but its layers unpacking past it (a gzip layer of zeros)
    with sessions.begin() as session:
        session.scalars(select(Round)).one().image_bytes = 4 * 2**20
    bomb = handmade_archive(
        tmp_path / "bomb.tar", [GOOD_FILES, {"zeros": bytes(8 * 2**20)}], ENTRY, compress=True
    )
    assert bomb.stat().st_size < 2**20
    made = submit(sessions, artifacts, "alpha", bomb)
    assert made.status == "rejected" and "unpacks to more than" in made.validation_errors
    assert "missing" not in made.validation_errors  # it has both files: only the real problem (issue 47)
    big = handmade_archive(tmp_path / "big.tar", [GOOD_FILES, {"noise": bytes(5 * 2**20)}], ENTRY)
    with pytest.raises(UserError, match="the limit is"):
        submit(sessions, artifacts, "alpha", big)
    sif = tmp_path / "detector.sif"
    sif.write_bytes(b"\0" * 64)
    if not NO_SQUASHFS:  # no SIF engine is needed, only a SIF
        with pytest.raises(UserError, match="not a SIF image") as caught:
            submit(sessions, artifacts, "alpha", sif)
        assert "\n" not in str(caught.value)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(UserError, match=r"a \.sif image cannot be read here: unsquashfs not installed"):
        submit(sessions, artifacts, "alpha", sif)
    with sessions() as session:
        assert [s.status for s in session.scalars(select(Submission))] == ["rejected"]


# --- .sif submission checks (squashfs-tools, no SIF engine) -----------------------------------------------

RUNSCRIPT_FILES = {".singularity.d/runscript": b'#!/bin/sh\nexec python3 /entrypoint.py "$@"\n'}


def handmade_sif(
    path: Path,
    files: dict[str, bytes],
    signed: bool = False,
    fs: int = 1,
    links: dict[str, str] | None = None,
) -> Path:
    """A SIF whose primary partition is a SquashFS of ``files`` and symbolic ``links`` (name: target), never
    run: for the submission checks."""
    root = path.with_suffix(".root")
    shutil.rmtree(root, ignore_errors=True)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    for name, target in (links or {}).items():
        (root / name).symlink_to(target)
    objects = [SifObject(PARTITION, squash(root, path.with_suffix(".sqfs")), extra=partition_extra(fs))]
    if signed:
        objects.append(SifObject(SIGNATURE, pgp_signature(), None, 1, True, signature_extra()))
    return write_sif(path, objects)


@pytest.mark.skipif(NO_SQUASHFS, reason="squashfs-tools not installed (`make install`)")
def test_a_sif_is_stored_as_sent_read_for_its_metaparameters_and_its_signature_noted(
    fake_board, tmp_path: Path
) -> None:
    sessions, artifacts = fake_board
    sif = handmade_sif(tmp_path / "detector.sif", {**GOOD_FILES, **RUNSCRIPT_FILES}, signed=True)
    made = submit(sessions, artifacts, "alpha", sif)
    assert made.status == "queued", made.validation_errors
    assert made.technique == "weight spread"
    stored = Path(made.artifact_path)
    assert [p.name for p in stored.iterdir()] == ["image.sif"]
    assert (stored / "image.sif").read_bytes() == sif.read_bytes()
    assert submissions.stored_image(stored) == str(stored / "image.sif")
    with sessions() as session:
        log = session.scalars(select(Job)).one().log
    assert log == (
        "warning: the image carries an OpenPGP clear-signed signature (SHA-256, key fingerprint "
        "0123456789ABCDEF0123456789ABCDEF01234567) of object group 1; signatures are not verified here\n"
    )


@pytest.mark.skipif(NO_SQUASHFS, reason="squashfs-tools not installed (`make install`)")
def test_bad_sif_images_are_refused_with_one_line_each(fake_board, tmp_path: Path) -> None:
    sessions, artifacts = fake_board
    good = {**GOOD_FILES, **RUNSCRIPT_FILES}
    for fs, message in ((5, "the primary system partition is encrypted"), (2, "partition is ext3")):
        with pytest.raises(UserError, match=message) as caught:
            submit(sessions, artifacts, "alpha", handmade_sif(tmp_path / f"fs{fs}.sif", good, fs=fs))
        assert "\n" not in str(caught.value)
    with sessions.begin() as session:
        session.scalars(select(Round)).one().image_bytes = 4 * 2**20
    rejected = {
        "/.singularity.d/runscript: missing from the image (singularity run runs it)": GOOD_FILES,
        "/metaparameters.json: missing from the image": {
            **RUNSCRIPT_FILES,
            "metaparameters_schema.json": GOOD_FILES["metaparameters_schema.json"],
        },
        "/metaparameters.json: field 'centre'": {**good, "metaparameters.json": b'{"centre": 99}'},
        "the image unpacks to more than 4194304 bytes": {**good, "zeros": bytes(5 * 2**20)},
    }
    escape = {"out": "../../etc/shadow"}  # with both metaparameter files: refused for the link alone
    rejected["/out: a link leading out of the image"] = good
    for number, (problem, files) in enumerate(rejected.items()):
        sif = handmade_sif(tmp_path / f"bad{number}.sif", files, links=escape if "/out" in problem else None)
        assert sif.stat().st_size < 4 * 2**20  # the file is small; what it unpacks to is not
        made = submit(sessions, artifacts, "alpha", sif)
        assert made.status == "rejected", problem
        lines = made.validation_errors.splitlines()
        assert len(lines) == 1 and lines[0].startswith(problem), lines  # the real problem, no other


# --- jobs (podman) ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=f"podman: {MISSING}")
def test_an_image_submission_runs_a_job_end_to_end(
    small_round: Path, image: BuiltImage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, artifacts = open_board(small_round / "splits", tmp_path, monkeypatch)
    # the practice job first: behind the sealed one it would wait for its publication tick (hourly here)
    local = submit(
        sessions, artifacts, "beta", image.local, split="smoke"
    )  # podman:REF, exported on submission
    made = submit(sessions, artifacts, "alpha", image.docker_archive, split="test")
    assert (made.status, local.status) == ("queued", "queued"), (
        made.validation_errors + local.validation_errors
    )
    assert made.technique == "weight spread"
    stored = Path(local.artifact_path) / "image.tar"
    assert submissions.stored_image(stored.parent) == str(stored)
    assert work(sessions, LocalExecutor(2), once=True) == 2

    with sessions() as session:
        jobs = {job.submission.team.name: job for job in session.scalars(select(Job))}
        for job in jobs.values():
            assert job.status == "done", job.log
            assert "isolation: podman (runc): image sha256:" in job.log and "no network" in job.log
            models = Path(job.submission.split.models_path)
            for result in job.results:
                assert result.flags == "" and result.exit_code == 0, result.stderr
                assert result.value == pytest.approx(expected_value(models / result.model_name), abs=1e-12)
                assert "weights from safetensors" in result.stderr
        test_job = jobs["alpha"]
        truth = read_truth(Path(test_job.submission.split.truth_path))
        names = sorted(truth)
        assert sorted(r.model_name for r in test_job.results) == names
        values = {r.model_name: r.value for r in test_job.results}
        overall = {m.name: m.value for m in test_job.metrics if not m.group_column}
        assert overall["cross_entropy"] == pytest.approx(
            cross_entropy([truth[n] for n in names], [values[n] for n in names]), abs=1e-12
        )
        assert len(jobs["beta"].results) == rounds.SMOKE_MODELS


def test_the_handmade_layout_is_what_podman_reads(tmp_path: Path) -> None:
    """The hand-written archives follow the docker-archive layout the reader expects of podman's own."""
    from assay.runner.images import read_archive

    archive = handmade_archive(tmp_path / "a.tar", [GOOD_FILES, {".wh.entrypoint.py": b""}], ENTRY)
    image = read_archive(archive, ["entrypoint.py", "metaparameters.json"], 2**20)
    assert image.command == ENTRY and set(image.root_files) == {"metaparameters.json"}
    assert image.image_id.startswith("sha256:")


# --- a .sif job (bubblewrap and squashfs-tools, no SIF engine) ---------------------------------------------


def sif_ready() -> str | None:
    from assay.runner.container import sif_missing

    if NO_SQUASHFS:
        return "squashfs-tools not installed (`make install`)"
    return sif_missing()


def folder_twin(folder: Path) -> Path:
    """The SIF's detector as a folder submission: the same entrypoint, module and parameters."""
    from container_image import WEIGHTSTAT

    (folder / "learned_parameters").mkdir(parents=True)
    for name, data in GOOD_FILES.items():
        (folder / name).write_bytes(data)
    (folder / "weightstat.py").write_text(WEIGHTSTAT)
    (folder / "learned_parameters" / "scale.json").write_text(json.dumps({"scale": 40.0}))
    return folder


@pytest.mark.slow
def test_a_sif_submission_scores_as_the_same_detector_does_as_a_folder(
    small_round: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if (reason := sif_ready()) is not None:
        pytest.skip(reason)
    monkeypatch.setenv("ASSAY_NODE_CACHE", str(tmp_path / "node-cache"))
    sessions, artifacts = open_board(small_round / "splits", tmp_path, monkeypatch)
    image = submit(sessions, artifacts, "alpha", build_sif(tmp_path / "sif"), split="test")
    folder = submit(sessions, artifacts, "beta", folder_twin(tmp_path / "folder"), split="test")
    assert (image.status, folder.status) == ("queued", "queued"), (
        image.validation_errors + folder.validation_errors
    )
    assert image.technique == folder.technique == "weight spread"
    assert work(sessions, LocalExecutor(2), once=True) == 2

    with sessions() as session:
        jobs = {job.submission.team.name: job for job in session.scalars(select(Job))}
        for job in jobs.values():
            assert job.status == "done", job.log
        log = jobs["alpha"].log
        assert "key fingerprint 0123456789ABCDEF0123456789ABCDEF01234567) of object group 1" in log
        assert "isolation: sif, no engine (unsquashfs, bubblewrap): image sha256:" in log
        assert "not verified" in log and "no network" in log
        truth = read_truth(Path(jobs["alpha"].submission.split.truth_path))
        names = sorted(truth)
        models = Path(jobs["alpha"].submission.split.models_path)
        values = {}
        for team, job in jobs.items():
            assert sorted(r.model_name for r in job.results) == names
            for result in job.results:
                assert result.flags == "" and result.exit_code == 0, result.stderr
                assert "weights from safetensors" in result.stderr
            values[team] = {r.model_name: r.value for r in job.results}
        assert values["alpha"] == values["beta"]  # the same detector, the same answers, bit for bit
        for name in names:
            assert values["alpha"][name] == pytest.approx(expected_value(models / name), abs=1e-12)
        overall = {
            team: {m.name: m.value for m in job.metrics if not m.group_column} for team, job in jobs.items()
        }
        assert overall["alpha"] == overall["beta"]
        assert overall["alpha"]["cross_entropy"] == pytest.approx(
            cross_entropy([truth[n] for n in names], [values["alpha"][n] for n in names]), abs=1e-12
        )
        print(
            f"\nSIF vs folder on {len(names)} test models: cross entropy "
            f"{overall['alpha']['cross_entropy']:.6f} vs {overall['beta']['cross_entropy']:.6f}"
        )


def test_the_docs_state_the_image_limit_the_code_enforces() -> None:
    """Issue 47: docs/leaderboard.md said images unpack within 512 MiB; the code's limit is the round's
    ``--max-image-gb``, 8 GiB by default (a 40 KiB SIF holding a 600 MiB sparse file was accepted)."""
    docs = (Path(__file__).parents[2] / "docs" / "leaderboard.md").read_text()
    checks = " ".join(docs.split("- **Checks at submission**", 1)[1].split("\n- **", 1)[0].split())
    default = Round.__table__.c.image_bytes.default.arg
    assert f"--max-image-gb`, {default / 2**30:g} GiB by default" in checks
    assert "512 MiB artifact limit" in checks and "artifact limit (512 MiB" not in checks
