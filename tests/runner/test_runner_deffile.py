"""Apptainer definition files read without apptainer (``assay.runner.deffile``), the SIF writer of
``assay leaderboard image build`` (``assay.runner.sif.write_sif``), and Docker Hub names as ``Bootstrap:
docker`` means them. Pure parsing: no podman. The builds themselves are tested in
``tests/leaderboard/test_leaderboard_imagebuild.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from sif_image import DESCRIPTOR, HEADER, PARTITION, PRIMARY_SYSTEM, SQUASHFS

from assay.errors import UserError
from assay.runner.deffile import (
    FileCopy,
    environment_file,
    parse_definition,
    parse_text,
    post_command,
    runscript_file,
)
from assay.runner.imagebuild import docker_name
from assay.runner.sif import read_contents, read_sif, system_partition, write_sif

WHERE = Path("detector.def")

# usnistgov/trojai-example, branch baseline-example, detector.def as published
TROJAI_EXAMPLE = """Bootstrap: docker
From: pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime

%files
    ./detector.py /
    ./entrypoint.py /
    ./utils /
    ./metaparameters.json /
    ./metaparameters_schema.json /
    ./learned_parameters /

%post
    pip install --upgrade pip
    pip install torchvision==0.14.1
    pip install jsonschema jsonargparse jsonpickle scikit-learn scikit-image

%runscript
    exec python3 /entrypoint.py "$@"
"""


def test_the_trojai_example_definition_is_read_as_published() -> None:
    parsed = parse_text(TROJAI_EXAMPLE, WHERE)
    assert (parsed.bootstrap, parsed.source, parsed.from_line) == (
        "docker",
        "pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime",
        2,
    )
    assert parsed.files == tuple(
        FileCopy(f"./{name}", "/", line)
        for line, name in enumerate(
            [
                "detector.py",
                "entrypoint.py",
                "utils",
                "metaparameters.json",
                "metaparameters_schema.json",
                "learned_parameters",
            ],
            start=5,
        )
    )
    assert parsed.post is not None and parsed.post.line == 12
    assert parsed.post.text.split("\n")[:3] == [
        "    pip install --upgrade pip",
        "    pip install torchvision==0.14.1",
        "    pip install jsonschema jsonargparse jsonpickle scikit-learn scikit-image",
    ]
    assert post_command(parsed.post, "/.post.script") == ["/bin/sh", "-ex", "/.post.script"]
    # apptainer's runscript file: #!/bin/sh, a blank line, the section as written
    assert runscript_file(parsed.runscript) == '#!/bin/sh\n\n    exec python3 /entrypoint.py "$@"\n\n'
    assert (parsed.environment, parsed.labels, parsed.help) == ("", (), "")


def test_case_comments_blank_lines_labels_help_and_repeated_sections() -> None:
    text = """# a TrojAI detector
BootStrap: LocalImage   # the base, built here
FROM: base.sif

%Files
    # the detector
    "my detector.py" /opt/my\\ detector.py
    weights.bin

%POST -c /bin/bash
    echo one
%labels
    Author team alpha
    Version 2
%help
    Run me with the TrojAI arguments.
%environment
    export A=1
%post
    echo two
%runscript -e
    #!/bin/bash
    exec python3 /detector.py "$@"
"""
    parsed = parse_text(text, WHERE)
    assert (parsed.bootstrap, parsed.source) == ("localimage", "base.sif")
    assert parsed.files == (
        FileCopy("my detector.py", "/opt/my detector.py", 7),
        FileCopy("weights.bin", "", 8),
    )
    assert parsed.post is not None and parsed.post.text.split() == ["echo", "one", "echo", "two"]
    assert post_command(parsed.post, "/.post.script") == ["/bin/sh", "-ex", "-c", "/bin/bash /.post.script"]
    assert parsed.labels == (("Author", "team alpha"), ("Version", "2"))
    assert parsed.help.strip() == "Run me with the TrojAI arguments."
    assert environment_file(parsed.environment) == "#!/bin/sh\n\n    export A=1\n\n"
    # the runscript's own #! line wins over /bin/sh; the section's arguments follow it
    assert runscript_file(parsed.runscript) == '#!/bin/bash -e\n\n    exec python3 /detector.py "$@"\n\n'


SUPPORTED = "(supported: %files, %post, %environment, %runscript, %labels, %help)"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "Bootstrap: docker\nFrom: x\n%setup\n  touch $SINGULARITY_ROOTFS/x\n%runscript\n  true\n",
            f"detector.def:3: section '%setup' is not supported {SUPPORTED}",
        ),
        ("Bootstrap: docker\nFrom: x\n%runscript\n true\n%test\n true\n", "detector.def:5: section '%test'"),
        ("Bootstrap: docker\nFrom: x\n%startscript\n true\n", "detector.def:3: section '%startscript'"),
        ("Bootstrap: docker\nFrom: x\n%appinstall foo\n true\n", "detector.def:3: section '%appinstall'"),
        (
            "Bootstrap: library\nFrom: alpine\n%runscript\n true\n",
            "detector.def:1: field 'Bootstrap' 'library' is not supported (supported: docker, localimage",
        ),
        ("Bootstrap: debootstrap\nFrom: x\n", "detector.def:1: field 'Bootstrap' 'debootstrap' is not"),
        (
            "Bootstrap: docker\nFrom: x\nStage: one\n%runscript\n true\n",
            "detector.def:3: header key 'Stage' is not supported (supported: Bootstrap, From)",
        ),
        ("From: x\n%runscript\n true\n", "detector.def: no 'Bootstrap:' header"),
        ("Bootstrap: docker\n%runscript\n true\n", "detector.def:1: no 'From:' header"),
        (
            "Bootstrap: docker\nFrom: x\n%post\n true\n",
            "detector.def: no %runscript section: a submission runs its runscript",
        ),
        ("Bootstrap: docker\nFrom: x\n%runscript\n\n  \n", "detector.def: no %runscript section"),
        (
            "Bootstrap: docker\nFrom: x\n%files from build\n a /a\n%runscript\n true\n",
            "detector.def:3: '%files from build': copying from another build stage is not supported",
        ),
        (
            "Bootstrap: docker\nFrom: x\n%files\n a b c\n%runscript\n true\n",
            "detector.def:4: %files line 'a b c' is not 'SOURCE [DESTINATION]'",
        ),
        (
            "Bootstrap: docker\nFrom: x\n%runscript\n true\nBootstrap: docker\nFrom: y\n",
            "detector.def:5: a second 'Bootstrap:' starts another build stage",
        ),
        (
            "Bootstrap: docker\nFrom: x\n%environment -x\n A=1\n%runscript\n true\n",
            "detector.def:3: section '%environment' takes no arguments",
        ),
        (
            "Bootstrap: docker\nFrom: x\n%post -c\n true\n%runscript\n true\n",
            "detector.def:3: '%post -c' needs a shell",
        ),
        ("Bootstrap docker\n", "detector.def:1: header line 'Bootstrap docker' is not 'Key: value'"),
    ],
)
def test_what_is_not_supported_is_named_in_one_line(text: str, problem: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_text(text, WHERE)
    assert str(caught.value).startswith(problem), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_file_that_is_not_utf8_or_a_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "detector.def").write_bytes(b"Bootstrap: docker\nFrom: caf\xe9\n")
    with pytest.raises(UserError, match=r"detector.def:2: .*definition file"):
        parse_definition(tmp_path / "detector.def")
    with pytest.raises(UserError, match="a folder; give the definition file"):
        parse_definition(tmp_path)


@pytest.mark.parametrize(
    ("ref", "full"),
    [
        (
            "pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime",
            "docker.io/pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime",
        ),
        ("ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
        ("docker://python:3.11-slim", "docker.io/library/python:3.11-slim"),
        ("localhost/detector:1", "localhost/detector:1"),
        ("ghcr.io/team/detector:2", "ghcr.io/team/detector:2"),
        ("registry:5000/detector", "registry:5000/detector"),
    ],
)
def test_docker_bootstrap_names_are_docker_hub_names(ref: str, full: str) -> None:
    assert docker_name(ref) == full


# --- the SIF writer ----------------------------------------------------------------------------------------


@pytest.mark.skipif(
    shutil.which("mksquashfs") is None, reason="squashfs-tools not installed (`make install`)"
)
def test_the_sif_writer_lays_the_file_out_as_pkg_sif_does(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / ".singularity.d").mkdir(parents=True)
    (root / ".singularity.d" / "runscript").write_text("#!/bin/sh\n\nexec true\n")
    (root / "metaparameters.json").write_text('{"centre": 0.2}')
    squashed = tmp_path / "root.squashfs"
    subprocess.run(["mksquashfs", str(root), str(squashed), "-quiet", "-no-progress"], check=True)
    deffile = TROJAI_EXAMPLE.encode()
    write_sif(tmp_path / "out.sif", squashed, deffile, "amd64", bytes(range(16)))
    data = (tmp_path / "out.sif").read_bytes()

    # the layout as the tests' own writer spells it: header, table at 4096, page-aligned objects
    launch, magic, version, arch, uuid, _, _, free, total, table, table_bytes, data_at, data_bytes = (
        HEADER.unpack_from(data)
    )
    assert (launch.rstrip(b"\0"), magic, version, arch) == (
        b"#!/usr/bin/env run-singularity\n",
        b"SIF_MAGIC\0",
        b"01\0",
        b"02\0",
    )
    assert (uuid, free, total, table, table_bytes) == (bytes(range(16)), 46, 48, 4096, 48 * DESCRIPTOR.size)
    assert data_at + data_bytes == len(data)
    rows = [DESCRIPTOR.unpack_from(data, table + i * DESCRIPTOR.size) for i in range(3)]
    assert rows[2][1] is False  # the third entry unused
    deffile_row, partition_row = rows[0], rows[1]
    assert (deffile_row[0], deffile_row[2], deffile_row[3]) == (0x4001, 1, 0xF0000001)
    assert data[deffile_row[5] : deffile_row[5] + deffile_row[6]] == deffile
    assert (partition_row[0], partition_row[2], partition_row[5] % 4096) == (PARTITION, 2, 0)
    assert (
        partition_row[13][:11]
        == SQUASHFS.to_bytes(4, "little") + PRIMARY_SYSTEM.to_bytes(4, "little") + b"02\0"
    )
    assert data[partition_row[5] : partition_row[5] + partition_row[6]] == squashed.read_bytes()

    # and our reader takes it whole, as the leaderboard's checks do
    image = read_sif(tmp_path / "out.sif")
    assert system_partition(image).size == squashed.stat().st_size
    contents = read_contents(tmp_path / "out.sif", ["metaparameters.json"], 2**20)
    assert contents.root_files == {"metaparameters.json": b'{"centre": 0.2}'} and contents.runscript
