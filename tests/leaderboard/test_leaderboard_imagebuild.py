"""``assay leaderboard image build``: a definition file built with podman (``assay.runner.imagebuild``) into
a docker-archive and a SIF, each submitted and scored on a zoo round exactly as the same detector submitted
as a folder; and the refusals, one line each with exit code 2, before anything is built.

The definition file uses every supported section: ``%files`` copies a file (renamed), a glob, a folder (as
a folder, as ``cp -r`` copies it) and a module into ``/opt``, a folder of the base (so inside it, found by
asking the base's ``/bin/sh``); ``%post`` writes the
metaparameters the detector reads, with shell arithmetic that only a shell that ran it could have done;
``%environment`` sets the ``PYTHONPATH`` without which the detector cannot import its module; ``%runscript``
starts it. The base is ``container_image.shell_base``: this host's Python and ``/bin/sh``, nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from test_leaderboard_container import folder_twin, open_board, sif_ready, submit

from assay.leaderboard import rounds
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.runner.imagebuild import BuiltImage, build_image
from assay.store import Job
from container_image import ENTRYPOINT, SCHEMA, WEIGHTSTAT, expected_value, podman_ready, shell_base

MISSING = podman_ready()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None, reason=f"podman: {MISSING}"),
]

DEFINITION = """Bootstrap: docker
From: {base}

# the weight-spread detector of container_image.py, laid out by the definition file
%files
    ./detector/entrypoint.py /detector.py
    ./detector/*.json /
    ./detector/learned_parameters /
    ./detector/weightstat.py /opt

%post
    # shell arithmetic: only /bin/sh running this writes 0.2
    tenths=$(( 1 + 1 ))
    printf '{{"centre": 0.%s}}\\n' "$tenths" > /metaparameters.json
    echo "post ran in $(pwd) as $0" > /opt/post.txt

%environment
    export PYTHONPATH=/opt

%labels
    Team alpha

%runscript
    exec python3 /detector.py "$@"
"""


def detector_project(folder: Path, base: str) -> Path:
    """A performer's folder: ``detector.def`` and, under ``detector/``, the files it copies."""
    source = folder / "detector"
    (source / "learned_parameters").mkdir(parents=True)
    (source / "entrypoint.py").write_text(ENTRYPOINT)
    (source / "weightstat.py").write_text(WEIGHTSTAT)
    (source / "metaparameters_schema.json").write_text(json.dumps(SCHEMA))
    (source / "learned_parameters" / "scale.json").write_text(json.dumps({"scale": 40.0}))
    (folder / "detector.def").write_text(DEFINITION.format(base=base))
    return folder / "detector.def"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuiltImage]:
    folder = tmp_path_factory.mktemp("imagebuild")
    definition = detector_project(folder / "project", shell_base(folder / "base"))
    return {fmt: build_image(definition, folder / f"detector.{fmt}") for fmt in ("tar", "sif")}


def test_both_outputs_hold_what_the_definition_file_asked_for(built: dict[str, BuiltImage]) -> None:
    from assay.runner.images import read_archive
    from assay.runner.sif import read_contents

    wanted = ["metaparameters.json", "metaparameters_schema.json", "detector.py"]
    archive = read_archive(built["tar"].out, wanted, 2**30)
    assert archive.entrypoint == ["/.singularity.d/actions/run"] and archive.cmd == []
    sif = read_contents(built["sif"].out, wanted, 2**30)
    for files in (archive.root_files, sif.root_files):
        assert files["metaparameters.json"] == b'{"centre": 0.2}\n'  # written by %post's shell
        assert files["detector.py"] == ENTRYPOINT.encode()  # a file copied under a new name
    assert sif.runscript and sif.image.arch == "amd64"
    assert [d.kind for d in sif.image.descriptors] == ["definition file", "partition"]
    # the images are gone from podman's storage (no --tag), the outputs are what is left
    for image in built.values():
        assert subprocess.run(["podman", "image", "exists", image.image_id]).returncode == 1


def test_built_images_score_as_the_same_detector_does_as_a_folder(
    small_round: Path, built: dict[str, BuiltImage], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if (reason := sif_ready()) is not None:
        pytest.skip(reason)
    monkeypatch.setenv("ASSAY_NODE_CACHE", str(tmp_path / "node-cache"))
    sessions, artifacts = open_board(small_round / "splits", tmp_path, monkeypatch)
    with sessions.begin() as session:
        rounds.add_team(session, "gamma")
    made = {
        "alpha": submit(sessions, artifacts, "alpha", built["tar"].out, split="test"),
        "beta": submit(sessions, artifacts, "beta", built["sif"].out, split="test"),
        "gamma": submit(sessions, artifacts, "gamma", folder_twin(tmp_path / "folder"), split="test"),
    }
    assert all(m.status == "queued" for m in made.values()), [m.validation_errors for m in made.values()]
    assert {m.technique for m in made.values()} == {"weight spread"}
    assert work(sessions, LocalExecutor(2), once=True) == 3

    with sessions() as session:
        jobs = {job.submission.team.name: job for job in session.scalars(select(Job))}
        assert "isolation: podman (runc)" in jobs["alpha"].log
        assert "isolation: sif, no engine" in jobs["beta"].log
        models = Path(jobs["alpha"].submission.split.models_path)
        values = {}
        for team, job in jobs.items():
            assert job.status == "done", job.log
            for result in job.results:
                assert result.flags == "" and result.exit_code == 0, result.stderr
                assert "weights from safetensors" in result.stderr
            values[team] = {r.model_name: r.value for r in job.results}
        assert values["alpha"] == values["beta"] == values["gamma"]  # bit for bit
        for name, value in values["alpha"].items():
            assert value == pytest.approx(expected_value(models / name), abs=1e-12)
        metrics = {t: {m.name: m.value for m in j.metrics if not m.group_column} for t, j in jobs.items()}
        assert metrics["alpha"] == metrics["beta"] == metrics["gamma"]


LOCAL = """Bootstrap: localimage
From: {base}

%files
    extra.txt /

%runscript
    exec python3 /detector.py "$@"
"""


@pytest.mark.parametrize("kind", ["sif", "docker-archive", "folder"])
def test_a_local_image_is_a_base_and_leaves_no_trace_in_storage(
    kind: str, built: dict[str, BuiltImage], tmp_path: Path
) -> None:
    """``Bootstrap: localimage`` over each kind of base: a .sif (its root unpacked and imported), a
    docker-archive (loaded, then its names and image taken out of podman's storage again) and a root
    folder; the new image keeps the base's files, its runscript replaced."""
    from assay.runner.images import read_archive
    from assay.runner.sif import read_sif, system_partition
    from assay.runner.squashfs import unpack

    base = {"sif": built["sif"].out, "docker-archive": built["tar"].out}.get(kind)
    if kind == "folder":
        base = tmp_path / "root"
        unpack(built["sif"].out, system_partition(read_sif(built["sif"].out)).offset, base, None)
    archive_id = read_archive(built["tar"].out).image_id.removeprefix("sha256:")
    (tmp_path / "extra.txt").write_text("extra\n")
    (tmp_path / "detector.def").write_text(LOCAL.format(base=base))
    made = build_image(tmp_path / "detector.def", tmp_path / "again.tar")
    contents = read_archive(made.out, ["metaparameters.json", "extra.txt"], 2**30)
    assert contents.root_files["extra.txt"] == b"extra\n"
    assert contents.root_files["metaparameters.json"] == b'{"centre": 0.2}\n'  # the base's %post output
    assert subprocess.run(["podman", "image", "exists", archive_id]).returncode == 1
    assert subprocess.run(["podman", "image", "exists", made.image_id]).returncode == 1


# --- refusals: one line, exit code 2, nothing built, nothing left ------------------------------------------


def assay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "assay", *args], capture_output=True, text=True, check=False)


REFUSALS = {
    "unsupported section": (
        "Bootstrap: docker\nFrom: {base}\n%setup\n  touch x\n%runscript\n  true\n",
        "detector.def:3: section '%setup' is not supported (supported: %files, %post",
    ),
    "unknown bootstrap": (
        "Bootstrap: library\nFrom: alpine:3\n%runscript\n  true\n",
        "detector.def:1: field 'Bootstrap' 'library' is not supported (supported: docker, localimage",
    ),
    "no runscript": (
        "Bootstrap: docker\nFrom: {base}\n%post\n  true\n",
        "detector.def: no %runscript section",
    ),
    "missing source": (
        "Bootstrap: docker\nFrom: {base}\n%files\n  ./detector.py /\n  ./utils /\n%runscript\n  true\n",
        "detector.def:5: field '%files' source './utils' does not exist",
    ),
    "image not in storage": (
        "Bootstrap: docker\nFrom: pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime\n%runscript\n  true\n",
        "detector.def:2: field 'From' image 'pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime' is not in "
        "podman's local storage",
    ),
    "post fails": (
        "Bootstrap: docker\nFrom: {base}\n%post\n  exit 3\n%runscript\n  true\n",
        "detector.def: podman build failed",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_are_one_line_and_leave_nothing_behind(case: str, tmp_path: Path) -> None:
    text, problem = REFUSALS[case]
    base = shell_base(tmp_path.parent / "refusal-base")
    (tmp_path / "detector.py").write_text("print('hi')\n")
    (tmp_path / "detector.def").write_text(text.format(base=base))
    out = tmp_path / "out" / "detector.sif"
    tag = f"localhost/assay-refused-{case.replace(' ', '-')}:1"
    done = assay(
        "leaderboard", "image", "build", str(tmp_path / "detector.def"), "--out", str(out), "--tag", tag
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], done.stderr
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    assert subprocess.run(["podman", "image", "exists", tag]).returncode == 1
