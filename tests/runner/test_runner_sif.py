"""SIF images without apptainer: ``assay.runner.sif`` (the format), ``assay.runner.squashfs`` (unpacking)
and ``.sif`` tasks run by ``run_task`` under bubblewrap on the image's own root.

Conformance: every test image of apptainer's SIF library (``sif_images/``, copied unchanged) is read as its
generator made it, or refused in one line saying why; headers the library never writes (bad magic, another
version, encrypted or ext3 partitions, unknown architectures, tables or objects past the file's end) are
written here by ``sif_image.py``. Running: a SIF built here from the OCI test image's files (this host's
Python, the weight-spread detector and its own module) gives the answer the same detector gives as a
folder, and sees nothing of the host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
from sif_image import (
    EXT3,
    GENERIC_JSON,
    PARTITION,
    PRIMARY_SYSTEM,
    RAW,
    SIGNATURE,
    SYSTEM,
    SifObject,
    build_sif,
    partition_extra,
    pgp_signature,
    sif_bytes,
    signature_extra,
    squash,
    write_sif,
)
from test_runner_container import LIMITS, TROJAI_ARGS, model_folder

from assay.errors import UserError
from assay.runner import Limits, Task, run_task
from assay.runner.container import sif_environment, sif_missing, sif_script
from assay.runner.isolation import prepare_image_root
from assay.runner.sif import (
    DESCRIPTOR,
    HEADER,
    read_contents,
    read_sif,
    signature_notes,
    system_partition,
)
from assay.runner.squashfs import escapes, held_root, read_files, root_key, survey, unpack
from container_image import ENTRYPOINT, METAPARAMETERS, SCHEMA, WEIGHTSTAT, expected_value

IMAGES = Path(__file__).with_name("sif_images")
HELLO = b"Hello from Sylabs!\n"  # /hello.txt of the library's root.squashfs
PGP_KEY = "12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84"  # the library's test/keys/private.asc
NO_TOOLS = shutil.which("unsquashfs") is None or shutil.which("mksquashfs") is None
needs_tools = pytest.mark.skipif(NO_TOOLS, reason="squashfs-tools not installed (`make install`)")
NO_PRIMARY = "no primary system partition (no partition at all): nothing to run"
NOT_SQUASHFS = "the primary system partition holds no SquashFS file system (no superblock)"

# Every image of the library: what it holds (objects, the primary partition, signatures by format and
# key) or why it is refused, the reason being the one line after the path.
CONFORMANCE = {
    "empty.sif": (0, NO_PRIMARY, []),
    "empty-id.sif": (0, NO_PRIMARY, []),
    "empty-launch-script.sif": (0, NO_PRIMARY, []),
    "one-object-time.sif": (1, NO_PRIMARY, []),
    "one-object-generic-json.sif": (1, NO_PRIMARY, []),
    "one-object-crypt-message.sif": (1, NO_PRIMARY, []),
    "one-object-sbom.sif": (1, NO_PRIMARY, []),
    "one-object-oci-root-index.sif": (1, NO_PRIMARY, []),
    "one-object-oci-blob.sif": (1, NO_PRIMARY, []),
    "one-group.sif": (2, "SquashFS 386", []),
    "one-group-signed-dsse.sif": (3, "SquashFS 386", [("DSSE envelope", None)]),
    "one-group-signed-pgp.sif": (3, "SquashFS 386", [("OpenPGP clear-signed", PGP_KEY)]),
    "one-group-signed-legacy.sif": (3, NOT_SQUASHFS, [("OpenPGP clear-signed", PGP_KEY)]),
    "one-group-signed-legacy-group.sif": (3, NOT_SQUASHFS, [("OpenPGP clear-signed", PGP_KEY)]),
    "one-group-signed-legacy-all.sif": (4, NOT_SQUASHFS, [("OpenPGP clear-signed", PGP_KEY)] * 2),
    "two-groups.sif": (3, "SquashFS 386", []),
    "two-groups-signed-dsse.sif": (5, "SquashFS 386", [("DSSE envelope", None)] * 2),
    "two-groups-signed-pgp.sif": (5, "SquashFS 386", [("OpenPGP clear-signed", PGP_KEY)] * 2),
    "two-groups-signed-legacy.sif": (4, NOT_SQUASHFS, [("OpenPGP clear-signed", PGP_KEY)]),
    "two-groups-signed-legacy-group.sif": (4, NOT_SQUASHFS, [("OpenPGP clear-signed", PGP_KEY)]),
    "two-groups-signed-legacy-all.sif": (5, NOT_SQUASHFS, [("OpenPGP clear-signed", PGP_KEY)] * 2),
}


def test_every_library_image_is_listed() -> None:
    assert sorted(p.name for p in IMAGES.glob("*.sif")) == sorted(CONFORMANCE)
    assert sum(p.stat().st_size for p in IMAGES.glob("*.sif")) < 2 * 2**20


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_library_images_are_read_or_refused_in_one_line(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    objects, outcome, signatures = CONFORMANCE[name]
    image = read_sif(IMAGES / name)
    assert len(image.descriptors) == objects
    assert [(s.format, s.fingerprint) for s in image.signatures()] == signatures
    assert len(signature_notes(image)) == len(signatures)
    assert all("not verified" in note for note in signature_notes(image))
    if not outcome.startswith("SquashFS"):
        with pytest.raises(UserError) as caught:
            system_partition(image)
        assert str(caught.value) == f"{IMAGES / name}: {outcome}" or outcome in str(caught.value)
        assert "\n" not in str(caught.value)
        return
    partition = system_partition(image)
    assert f"{partition.fs_name} {partition.arch}" == outcome
    if NO_TOOLS:
        return
    # its file system, listed and read as it is inside the file
    listed = survey(image.path, partition.offset, 2**20, ["/hello.txt"])
    assert (listed.unpacked_bytes, listed.entries) == (len(HELLO), 2)
    assert read_files(image.path, partition.offset, listed, ["/hello.txt"]) == {"/hello.txt": HELLO}
    # a 386 image is refused on any other machine, in one line, and read whole on a 386 one
    monkeypatch.setattr("assay.runner.sif.host_arch", lambda: "amd64")
    with pytest.raises(UserError, match="the image is built for 386; this machine runs amd64"):
        read_contents(image.path)
    monkeypatch.setattr("assay.runner.sif.host_arch", lambda: "386")
    contents = read_contents(image.path, ["hello.txt", "metaparameters.json"], 2**20)
    assert contents.root_files == {"hello.txt": HELLO} and not contents.runscript


def test_library_header_fields_are_read_as_written() -> None:
    assert read_sif(IMAGES / "empty-id.sif").uuid == "3fa802cc-358b-45e3-bcc0-69dc7a45f9f8"
    assert read_sif(IMAGES / "empty-launch-script.sif").launch == "#!/usr/bin/env run-script\n"
    image = read_sif(IMAGES / "two-groups-signed-pgp.sif")
    assert (image.arch, image.file_bytes) == ("386", 305001)
    assert [(p.part_type, p.fs_name, p.arch) for p in image.partitions] == [
        (SYSTEM, "raw", "386"),
        (PRIMARY_SYSTEM, "SquashFS", "386"),
        (SYSTEM, "ext3", "amd64"),
    ]
    assert [s.signs for s in image.signatures()] == ["object group 1", "object group 2"]
    assert [s.signs for s in read_sif(IMAGES / "one-group-signed-legacy-all.sif").signatures()] == [
        "object 1",
        "object 2",
    ]
    assert read_sif(IMAGES / "one-group-signed-legacy.sif").signatures()[0].hash == "SHA-384"


# --- headers the library never writes -----------------------------------------------------------------------

SQUASHFS_MAGIC = b"hsqs"


@pytest.fixture(scope="module")
def tiny_squashfs(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    if NO_TOOLS:
        pytest.skip("squashfs-tools not installed (`make install`)")
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "root").mkdir()
    (folder / "root" / "hello.txt").write_bytes(HELLO)
    return squash(folder / "root", folder / "tiny.squashfs")


def primary(data: bytes, **fields) -> SifObject:
    return SifObject(PARTITION, data, extra=partition_extra(**fields), align=4096)


def refusals(squashfs: bytes) -> dict[str, tuple[bytes, str]]:
    """SIF files the library never writes, each with the reason it is refused."""
    good = sif_bytes([primary(squashfs)])
    table_end = 4096 + 48 * DESCRIPTOR.size
    return {
        "bad magic": (good[:32] + b"NOT_MAGIC\0" + good[42:], "not a SIF image (bad magic b'NOT_MAGIC'"),
        "short file": (good[:100], "not a SIF image (100 bytes; a SIF header is 128)"),
        "version 02": (sif_bytes([primary(squashfs)], version=b"02\0"), "SIF version '02' is not supported"),
        "table past the end": (good[: table_end - 1], "its descriptor table runs past the end of the file"),
        "object past the end": (good[: len(good) - 1], "its partition object 1 lies outside the file"),
        "no primary": (
            sif_bytes([SifObject(PARTITION, squashfs, extra=partition_extra(part=SYSTEM), align=4096)]),
            "no primary system partition (1 other partition): nothing to run",
        ),
        "only JSON": (sif_bytes([SifObject(GENERIC_JSON, b"{}")]), NO_PRIMARY),
        "two primaries": (sif_bytes([primary(squashfs), primary(squashfs)]), "2 primary system partitions"),
        "encrypted": (
            sif_bytes([primary(squashfs, fs=5)]),
            "the primary system partition is encrypted (encrypted SquashFS); submit an unencrypted image",
        ),
        "gocryptfs": (sif_bytes([primary(squashfs, fs=6)]), "is encrypted (gocryptfs SquashFS)"),
        "ext3": (
            sif_bytes([primary(squashfs, fs=EXT3)]),
            "the primary system partition is ext3; only SquashFS",
        ),
        "raw": (sif_bytes([primary(squashfs, fs=RAW)]), "the primary system partition is raw"),
        "unknown fs": (sif_bytes([primary(squashfs, fs=77)]), "is unknown file system 77"),
        "unknown arch": (
            sif_bytes([primary(squashfs, arch=b"99")]),
            "the primary system partition is for an unknown architecture ('99')",
        ),
        "no superblock": (sif_bytes([primary(b"\0" * 4096)]), NOT_SQUASHFS),
        "squashfs 3": (
            sif_bytes([primary(squashfs[:28] + struct.pack("<H", 3) + squashfs[30:])]),
            "SquashFS is damaged or unsupported (version 3",
        ),
        "cut squashfs": (
            sif_bytes([primary(squashfs[: struct.unpack_from("<q", squashfs, 40)[0] - 1])]),
            "SquashFS is damaged or unsupported (version 4",
        ),
    }


def test_headers_the_library_never_writes_are_refused_in_one_line(
    tiny_squashfs: bytes, tmp_path: Path
) -> None:
    assert tiny_squashfs[:4] == SQUASHFS_MAGIC
    good = write_sif(tmp_path / "good.sif", [primary(tiny_squashfs)])
    assert read_contents(good, ["hello.txt"], 2**20).root_files == {"hello.txt": HELLO}
    for case, (data, reason) in refusals(tiny_squashfs).items():
        path = tmp_path / f"{case.replace(' ', '-')}.sif"
        path.write_bytes(data)
        with pytest.raises(UserError) as caught:
            read_contents(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and reason in message, (case, message)
        assert "\n" not in message, case


def test_the_layout_is_the_published_one() -> None:
    """The record sizes that apptainer's Go structs give (encoding/binary, packed)."""
    assert (HEADER.size, DESCRIPTOR.size) == (128, 585)
    library = (IMAGES / "one-group.sif").read_bytes()
    assert library[32:42] == b"SIF_MAGIC\0" and library[42:45] == b"01\0"


# --- unpacking safely ---------------------------------------------------------------------------------------


def squashed(tmp_path: Path, files: dict[str, bytes], *pseudo: str) -> Path:
    """A SquashFS file of ``files`` plus mksquashfs pseudo definitions (devices and links, no root needed)."""
    root = tmp_path / "tree"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    target = tmp_path / "fs.squashfs"
    argv = ["mksquashfs", str(root), str(target), "-noappend", "-quiet", "-no-progress"]
    for definition in pseudo:
        argv += ["-p", definition]
    import subprocess

    subprocess.run(argv, check=True, capture_output=True)
    return target


@needs_tools
def test_devices_links_out_and_oversized_roots_are_refused_before_unpacking(tmp_path: Path) -> None:
    cases = {
        "null c 666 root root 1 3": "/null: a device node in the image; images may not carry devices",
        "disk b 660 root root 8 0": "/disk: a device node in the image",
        "a/out s 777 root root ../../etc/shadow": "/a/out: a link leading out of the image ('../../etc",
    }
    for pseudo, reason in cases.items():
        fs = squashed(tmp_path, {"a/f": b"x"}, pseudo)
        dest = tmp_path / "dest"
        with pytest.raises(UserError) as caught:
            unpack(fs, 0, dest, None)
        assert str(caught.value) == f"{fs}: {reason}" or reason in str(caught.value)
        assert not dest.exists()
    fs = squashed(tmp_path, {"a": b"x" * 1000, "b": b"y" * 1000})
    with pytest.raises(UserError, match="the image unpacks to more than 1500 bytes; the limit is 1500"):
        survey(fs, 0, 1500)
    assert survey(fs, 0, 2000).unpacked_bytes == 2000
    fs = squashed(tmp_path, {"line\nbreak": b"x"})
    with pytest.raises(UserError, match="file list cannot be read"):
        survey(fs, 0, None)


@needs_tools
def test_an_unpacked_root_keeps_links_inside_and_loses_set_id_bits(tmp_path: Path) -> None:
    fs = squashed(
        tmp_path,
        {"usr/bin/tool": b"#!/bin/sh\n", "usr/lib/keep": b""},
        "usr/bin/tool m 6755 root root",
        "bin s 777 root root usr/bin",
        "usr/lib/abs s 777 root root /etc/passwd",
        "usr/lib/up s 777 root root ../bin/tool",
        "locked d 500 root root",
    )
    dest = tmp_path / "root"
    listed = unpack(fs, 0, dest, None)
    assert listed.unpacked_bytes == len(b"#!/bin/sh\n")
    assert os.readlink(dest / "bin") == "usr/bin" and os.readlink(dest / "usr/lib/abs") == "/etc/passwd"
    assert (dest / "usr/bin/tool").stat().st_mode & 0o7777 == 0o755  # no set-user-ID or set-group-ID
    assert (dest / "locked").stat().st_mode & 0o700 == 0o700  # removable by its owner later
    assert not escapes("/usr/lib/up", "../bin/tool") and escapes("/usr/lib/up", "../../../etc")
    assert not escapes("/a", "/etc/passwd") and escapes("/a", "..")
    prepare_image_root(dest)
    assert os.readlink(dest / "tmp") == "task/tmp" and all(
        (dest / d).is_dir() for d in ("proc", "dev", "task")
    )


@needs_tools
def test_a_root_is_unpacked_once_per_image_and_kept_while_in_use(
    tiny_squashfs: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASSAY_NODE_CACHE", str(tmp_path / "cache"))
    sif = write_sif(tmp_path / "a.sif", [primary(tiny_squashfs)])
    offset = system_partition(read_sif(sif)).offset
    calls = []
    with held_root(sif, offset, calls.append) as root:
        assert (root / "hello.txt").read_bytes() == HELLO and len(calls) == 1
        monkeypatch.setenv("ASSAY_NODE_CACHE_BYTES", "0")  # a trim now removes everything not held
        with held_root(sif, offset, calls.append) as again:
            assert again == root and len(calls) == 1
        assert root.exists()
    copy = tmp_path / "b.sif"
    copy.write_bytes(sif.read_bytes())
    assert root_key(copy, offset) == root_key(sif, offset)  # by content, not by path


# --- running a .sif ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sif_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sif-cache")


@pytest.fixture
def built(tmp_path_factory: pytest.TempPathFactory, sif_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The runnable test SIF, built once per session (a few seconds), its root cached for the session."""
    if NO_TOOLS or shutil.which("ldd") is None:
        pytest.skip("squashfs-tools or ldd not installed (`make install`)")
    if (reason := sif_missing()) is not None:
        pytest.skip(reason)
    monkeypatch.setenv("ASSAY_NODE_CACHE", str(sif_cache))
    return _built(tmp_path_factory)


_BUILT: list[Path] = []


def _built(factory: pytest.TempPathFactory) -> Path:
    if not _BUILT:
        _BUILT.append(build_sif(factory.mktemp("sif")))
    return _BUILT[0]


def folder_detector(folder: Path) -> Path:
    """The image's detector as a folder submission: the same entrypoint, module and parameters."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entrypoint.py").write_text(ENTRYPOINT)
    (folder / "weightstat.py").write_text(WEIGHTSTAT)
    (folder / "metaparameters.json").write_text(json.dumps(METAPARAMETERS))
    (folder / "metaparameters_schema.json").write_text(json.dumps(SCHEMA))
    (folder / "learned_parameters").mkdir(exist_ok=True)
    (folder / "learned_parameters" / "scale.json").write_text(json.dumps({"scale": 40.0}))
    return folder


def sif_task(sif: Path, model: Path, key: str = "m", **fields) -> Task:
    stage = {"detector": model, **{p.name: p for p in model.iterdir()}}
    argv = [sys.executable, "{input}/detector/entrypoint.py", *TROJAI_ARGS]
    fields.setdefault("limits", LIMITS)
    return Task(key=key, argv=argv, stage=stage, image=str(sif), **fields)


def probe(sif: Path, code: str, *args: str, **fields) -> Task:
    fields.setdefault("limits", LIMITS)
    return Task(key="p", argv=["--probe", code, *args], image=str(sif), **fields)


@pytest.mark.slow
def test_a_sif_detector_answers_as_the_same_detector_does_as_a_folder(built: Path, tmp_path: Path) -> None:
    from test_runner_container import write_safetensors

    model = model_folder(tmp_path, None)
    write_safetensors(model / "model.safetensors", [0.1 * ((-1) ** i) * (i % 7) for i in range(200)])
    result = run_task(sif_task(built, model))
    assert result.ok, result.stderr
    assert result.stderr.startswith("200 weights from safetensors")
    value = float(result.outputs["result.txt"])
    assert value == pytest.approx(expected_value(model), abs=1e-12)
    detector = folder_detector(tmp_path / "detector")
    folder_task = dataclasses.replace(sif_task(built, model), image=None, stage={"detector": detector})
    folder_task = dataclasses.replace(
        folder_task, stage={"detector": detector, **{p.name: p for p in model.iterdir()}}
    )
    as_folder = run_task(folder_task)
    assert as_folder.ok, as_folder.stderr
    assert as_folder.outputs == result.outputs
    # the job log's line: the image, its signature shown and not verified, the sandbox
    assert result.isolation.startswith("sif, no engine (unsquashfs, bubblewrap): image sha256:")
    assert "key fingerprint 0123456789ABCDEF0123456789ABCDEF01234567) of object group 1, not verified" in (
        result.isolation
    )
    assert "the image's own root read-only, with inputs only" in result.isolation
    assert (
        "no network" in result.isolation and f"at most {LIMITS.max_processes} processes" in result.isolation
    )


VIEW = """
import json, os, socket
names = ("ASSAY_SIF_ORDER", "HOME", "TMPDIR", "PYTHONPATH", "PATH", "APPTAINER_NAME", "CUDA_VISIBLE_DEVICES")
seen = {"root": sorted(os.listdir("/")), "env": {name: os.environ.get(name) for name in names}}
seen["host"] = [p for p in ("/work", "/root", "/home", "/etc/passwd", "/usr/lib/python3/dist-packages",
                            os.path.dirname(args[0])) if os.path.exists(p)]
seen["link"] = os.path.exists("/opt/host-link")  # -> /etc/hostname, which the image lacks
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2); seen["net"] = True
except OSError:
    seen["net"] = False
for place in ("/", "/usr", "/task/input", "/entrypoint.py"):
    try:
        open(os.path.join(place, "x") if os.path.isdir(place) else place, "a").close()
        seen[place] = "written"
    except OSError:
        seen[place] = "refused"
open("/tmp/t", "w").write("tmp ok")
seen["meminfo"] = open("/proc/meminfo").readline().split()[1]
seen["pid"] = os.getpid()
open("/task/output/result.txt", "w").write(json.dumps(seen))
"""


@pytest.mark.slow
def test_a_sif_detector_sees_only_its_image_its_inputs_and_its_scratch(built: Path, tmp_path: Path) -> None:
    import assay

    result = run_task(probe(built, VIEW, str(Path(assay.__file__).parent), stage={"f": built}))
    assert result.ok, result.stderr
    seen = json.loads(result.outputs["result.txt"])
    assert seen["root"] == sorted(
        [".singularity.d", "bin", "dev", "entrypoint.py", "learned_parameters", "lib", "lib64"]
        + ["metaparameters.json", "metaparameters_schema.json", "opt", "proc", "task", "tmp", "usr"]
        + (["etc"] if "etc" in seen["root"] else [])
    )
    assert seen["host"] == [] and seen["link"] is False and seen["net"] is False
    assert {seen[p] for p in ("/", "/usr", "/task/input", "/entrypoint.py")} == {"refused"}
    env = seen["env"]
    assert env["ASSAY_SIF_ORDER"] == "10,90"  # env/*.sh sourced in name order
    assert env["HOME"] == env["TMPDIR"] == "/task/scratch"  # the harness's, not the image's /nonexistent
    assert env["PYTHONPATH"] == "/opt/lib" and env["PATH"].startswith("/usr/local/sbin")
    assert env["APPTAINER_NAME"] == built.name and env["CUDA_VISIBLE_DEVICES"] == ""
    assert int(seen["meminfo"]) == LIMITS.memory_bytes // 1024 and seen["pid"] > 1  # bubblewrap's init is 1


@pytest.mark.slow
def test_a_sif_run_keeps_the_limits_of_a_folder_run(built: Path, tmp_path: Path) -> None:
    quick = dataclasses.replace(LIMITS, wall_seconds=3)
    slept = run_task(probe(built, "import time; time.sleep(60)", limits=quick))
    assert slept.timed_out and not slept.ok and slept.wall_seconds < 20
    hog = run_task(probe(built, "x = bytearray(2 * 2**30)"))
    assert hog.killed_for_memory and not hog.ok
    link = run_task(probe(built, "import os; os.symlink('/entrypoint.py', '/task/output/result.txt')"))
    assert link.ok and link.outputs == {"result.txt": None}  # a link is never followed back out
    failed = run_task(probe(built, "import sys; sys.exit(3)"))
    assert failed.exit_code == 3


def test_the_run_script_is_singularity_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    task = Task(key="m", argv=["x"], env={"TORCH_X": "a b'c", "1BAD": "x"}, limits=Limits())
    env = sif_environment(task, "image.sif")
    script = sif_script(env)
    lines = script.splitlines()
    assert lines[0].startswith("for script in /.singularity.d/env/*.sh; do")
    assert lines[-1] == 'exec /.singularity.d/runscript "$@"'
    assert "export TORCH_X='a b'\"'\"'c'" in lines and "export HOME=/task/scratch" in lines
    assert not any("PATH=" in line or "1BAD" in line for line in lines)


@pytest.mark.slow
def test_a_broken_sif_is_the_detectors_failure_in_one_line(
    built: Path, tmp_path: Path, tiny_squashfs: bytes
) -> None:
    model = model_folder(tmp_path, None)
    encrypted = write_sif(tmp_path / "enc.sif", [primary(tiny_squashfs, fs=5)])
    result = run_task(sif_task(encrypted, model))
    assert result.exit_code is None and not result.ok
    assert result.stderr == (
        "cannot start the container: the primary system partition is encrypted (encrypted SquashFS); "
        "submit an unencrypted image (the harness holds no key)"
    )
    runless = write_sif(tmp_path / "runless.sif", [primary(tiny_squashfs)])  # no /bin/sh, no runscript
    result = run_task(sif_task(runless, model))
    assert result.exit_code not in (0, None) and "/bin/sh" in result.stderr
    signed = write_sif(
        tmp_path / "signed.sif",
        [primary(tiny_squashfs), SifObject(SIGNATURE, pgp_signature(), None, 1, True, signature_extra())],
    )
    assert read_sif(signed).signatures()[0].signs == "object group 1"
