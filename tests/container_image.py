"""A small OCI image built on this machine, for the container tests: no registry, a few seconds, once per run.

Its root file system is this host's own Python interpreter (preferably Debian's ``/usr/bin/python3``: one
binary and four libraries), the shared libraries ``ldd`` names, and only the standard-library modules the
image's programs import. ``podman import`` makes it an image (``FROM scratch`` with an entrypoint), and
``podman save`` writes the docker-archive and oci-archive a performer would submit.

What the image runs (``/entrypoint.py``, NIST's ``python3 /entrypoint.py "$@"``):

- the TrojAI ``infer`` arguments, with or without the ``infer`` word: a real, if simple, detector. It reads
  the model's weights (``model.safetensors`` beside ``model.pt``, parsed by hand; else ``model.pt``'s
  bytes), its ``/metaparameters.json`` and ``/learned_parameters/scale.json``, and computes the
  probability with ``weightstat``, a module that exists only in the image (``/opt/lib``, on the image's own
  ``PYTHONPATH``); the host's virtual environment has no such module.
- ``--probe CODE ARG...``: runs the Python ``CODE`` with ``args`` = the ARGs (the runner tests' hostile
  programs: sleepers, memory hogs, fork bombs, network and file-system probes).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
# the tar helpers deploy/base_images.py makes the deploy's base images with: host files at their own paths
from base_images import add_bytes as _add_bytes
from base_images import add_file as _add_file
from base_images import libraries as _libraries

# What the image's programs import; the image holds these modules and what they import, nothing more.
MODULES = (
    *("argparse", "json", "os", "struct", "sys", "math", "zipfile", "socket", "time", "resource"),
    *("subprocess", "signal", "errno", "pathlib", "encodings.ascii", "encodings.latin_1", "encodings.idna"),
    "site",
)

WEIGHTSTAT = '''"""The image's own dependency: a statistic of a model's weights, from their raw bytes."""
import json
import math
import struct

def safetensors_floats(path):
    """Every float32 of a .safetensors file: 8-byte little-endian header length, JSON header, raw data."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
        data = handle.read()
    values = []
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] != "F32":
            continue
        start, end = entry["data_offsets"]
        values.extend(struct.unpack(f"<{(end - start) // 4}f", data[start:end]))
    return values

def byte_floats(path):
    """Without safetensors: the file's bytes, read as float32 where they are finite (a rough stand-in)."""
    data = open(path, "rb").read()
    data = data[: len(data) // 4 * 4]
    return [v for v in struct.unpack(f"<{len(data) // 4}f", data) if math.isfinite(v) and abs(v) < 1e3]

def probability(values, scale, centre):
    """A logistic of the weights' standard deviation: larger spreads read as more likely trojaned."""
    if not values:
        return 0.5
    mean = sum(values) / len(values)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return 1 / (1 + math.exp(-scale * (spread - centre)))
'''

ENTRYPOINT = """import argparse, json, os, sys

if len(sys.argv) > 2 and sys.argv[1] == "--probe":
    exec(compile(sys.argv[2], "probe", "exec"), {"args": sys.argv[3:], "__name__": "probe"})
    sys.exit(0)

import weightstat  # only in this image (/opt/lib, on the image's PYTHONPATH)

parser = argparse.ArgumentParser()
parser.add_argument("mode", nargs="?", default="infer")
for name in ("model_filepath", "result_filepath", "scratch_dirpath", "examples_dirpath",
             "round_training_dataset_dirpath", "metaparameters_filepath", "schema_filepath",
             "learned_parameters_dirpath", "source_dataset_dirpath"):
    parser.add_argument("--" + name)
args = parser.parse_args()
meta = json.load(open(args.metaparameters_filepath))
json.load(open(args.schema_filepath))
learned = json.load(open(os.path.join(args.learned_parameters_dirpath, "scale.json")))
weights = os.path.join(os.path.dirname(args.model_filepath), "model.safetensors")
if os.path.exists(weights):
    values, source = weightstat.safetensors_floats(weights), "safetensors"
else:
    values, source = weightstat.byte_floats(args.model_filepath), "model.pt bytes"
value = weightstat.probability(values, learned["scale"], meta["centre"])
print(f"{len(values)} weights from {source}: {value:.6f}", file=sys.stderr)
with open(args.result_filepath, "w") as handle:
    handle.write(repr(value))
"""

METAPARAMETERS = {"centre": 0.2}
SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "weight spread",
    "technique": "weight spread",
    "technique_description": "a logistic of the spread of a model's weights",
    "technique_changes": "container submission",
    "technique_type": ["Weight Analysis"],
    "commit_id": "0",
    "repo_name": "assay",
    "required": ["centre"],
    "additionalProperties": False,
    "type": "object",
    "properties": {"centre": {"type": "number", "minimum": 0, "maximum": 10, "suggested_minimum": 0}},
}


@dataclass(frozen=True)
class BuiltImage:
    """The image under three names: both archive formats and its tag in the host's podman storage."""

    docker_archive: Path
    oci_archive: Path
    local: str  # podman:localhost/...
    image_id: str
    build_seconds: float


def interpreter() -> Path:
    """The Python the image carries: Debian's (static libpython, four libraries) when there is one."""
    for candidate in ("/usr/bin/python3", sys.executable):
        path = Path(candidate).resolve()
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise RuntimeError("no Python interpreter to put in the image")


def _module_files(python: Path) -> list[Path]:
    """The standard-library files the image's programs need, as this interpreter finds them."""
    code = (
        f"import sys, json\nfor m in {MODULES!r}: __import__(m)\n"
        "print(json.dumps([getattr(m, '__file__', None) for m in list(sys.modules.values())]))"
    )
    done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, check=True)
    stdlib = subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    files = {Path(f) for f in json.loads(done.stdout) if f and f.startswith(stdlib + "/")}
    return sorted(p for p in files if "-packages" not in p.parts)


SHELL = Path("/bin/sh")


def rootfs(target: Path, detector: bool = True, shell: bool = False) -> Path:
    """The image's root file system as a tar: interpreter, libraries, modules and (``detector``) the
    detector and its metaparameters; ``shell`` adds ``/bin/sh`` and what it links."""
    python = interpreter()
    modules = _module_files(python)
    # the modules' compiled forms: the root is read-only, so nothing could cache them at run time
    cached = [p for m in modules for p in m.parent.glob(f"__pycache__/{m.stem}.*.pyc")]
    extensions = [m for m in modules if m.suffix == ".so"]
    shells = [SHELL.resolve()] if shell else []
    seen: set[str] = set()
    with tarfile.open(target, "w") as archive:
        for path in sorted({python, *modules, *cached, *shells, *_libraries([python, *extensions, *shells])}):
            _add_file(archive, path, seen)
        if shell and SHELL.resolve() != SHELL:
            _add_file(archive, SHELL, seen)
        stdlib = modules[0].parent if modules else python.parent
        lib_dynload = next((p.parent for p in extensions), stdlib / "lib-dynload")
        _add_file(archive, lib_dynload, seen)  # its presence keeps Python from warning at start-up
        if str(python) != "/usr/bin/python3":
            info = tarfile.TarInfo("usr/bin/python3")
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, str(python), 0
            _add_file(archive, Path("/usr/bin"), seen)
            archive.addfile(info)
        for folder in ("opt", "opt/lib", "learned_parameters") if detector else ("opt",):
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            archive.addfile(info)
        if not detector:
            return target
        _add_bytes(archive, "opt/lib/weightstat.py", WEIGHTSTAT.encode())
        _add_bytes(archive, "entrypoint.py", ENTRYPOINT.encode())
        _add_bytes(archive, "metaparameters.json", json.dumps(METAPARAMETERS).encode())
        _add_bytes(archive, "metaparameters_schema.json", json.dumps(SCHEMA).encode())
        _add_bytes(archive, "learned_parameters/scale.json", json.dumps({"scale": 40.0}).encode())
    return target


def _podman(*argv: str) -> str:
    done = subprocess.run(["podman", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _forget_older(tag: str) -> None:
    """Remove earlier builds of the test image (another interpreter, an edited detector) from the host's
    storage and the runner's own, so they do not pile up."""
    from assay.runner.container import ImageSpec, _podman

    repository = tag.split(":")[0]
    for prefix in (["podman"], _podman(ImageSpec("archive", ""))):
        listed = subprocess.run(
            [*prefix, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True
        )
        older = [name for name in listed.stdout.split() if name.startswith(repository + ":") and name != tag]
        if older:
            subprocess.run([*prefix, "rmi", "--force", *older], capture_output=True, check=False)


@functools.cache
def build_image(folder: Path) -> BuiltImage:
    """Build the test image (once per test run) and save it in both archive formats under ``folder``."""
    start = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    layer = rootfs(folder / "rootfs.tar")
    tag = "localhost/assay-test-detector:" + hashlib.sha256(layer.read_bytes()).hexdigest()[:12]
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode != 0:  # else: built before
        changes = ('ENTRYPOINT ["python3", "/entrypoint.py"]', "ENV PYTHONPATH=/opt/lib")
        _podman("import", "--quiet", *(f"--change={change}" for change in changes), str(layer), tag)
    image_id = _podman("image", "inspect", "--format", "{{.Id}}", tag)
    _forget_older(tag)
    docker, oci = folder / "detector-docker.tar", folder / "detector-oci.tar"
    for fmt, path in (("docker-archive", docker), ("oci-archive", oci)):
        path.unlink(missing_ok=True)  # podman save will not overwrite
        _podman("save", "--quiet", "--format", fmt, "--output", str(path), tag)
    return BuiltImage(docker, oci, "podman:" + tag, image_id, time.monotonic() - start)


@functools.cache
def shell_base(folder: Path) -> str:
    """A base image for definition-file builds (``assay leaderboard image build``): this host's Python and
    ``/bin/sh``, no detector and no ``PYTHONPATH``; its tag ``localhost/assay-test-shell:HASH`` in the
    host's storage (built once per test run)."""
    folder.mkdir(parents=True, exist_ok=True)
    layer = rootfs(folder / "shell-rootfs.tar", detector=False, shell=True)
    tag = "localhost/assay-test-shell:" + hashlib.sha256(layer.read_bytes()).hexdigest()[:12]
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode != 0:
        _podman("import", "--quiet", "--change=ENV PATH=/usr/local/bin:/usr/bin:/bin", str(layer), tag)
    _forget_older(tag)
    return tag


def expected_value(model_dir: Path) -> float:
    """The image detector's answer for a model, computed here from its weights with the image's formula."""
    namespace: dict = {}
    exec(WEIGHTSTAT, namespace)
    weights = model_dir / "model.safetensors"
    values = (
        namespace["safetensors_floats"](weights)
        if weights.exists()
        else namespace["byte_floats"](model_dir / "model.pt")
    )
    return namespace["probability"](values, 40.0, METAPARAMETERS["centre"])


def podman_ready() -> str | None:
    """Why the container tests cannot run here, or None."""
    from assay.runner.container import podman_missing

    missing = podman_missing()
    if missing is None and shutil.which("ldd") is None:
        return "ldd not installed (needed to build the test image)"
    return missing


def _tar_bytes(files: dict[str, bytes], compress: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if compress else "w") as archive:
        for name, data in files.items():
            _add_bytes(archive, name, data)
    return buffer.getvalue()


def handmade_archive(
    path: Path,
    layers: list[dict[str, bytes]],
    entrypoint: list[str] | None = None,
    images: int = 1,
    compress: bool = False,
) -> Path:
    """A docker-archive written by hand (no podman): for the submission checks, which never run it.

    ``layers`` bottom first, each a map of file name to bytes (``.wh.NAME`` deletes NAME below).
    """
    blobs = [_tar_bytes(files, compress) for files in layers]
    names = [hashlib.sha256(blob).hexdigest() + ".tar" for blob in blobs]
    runtime = {"Entrypoint": entrypoint} if entrypoint else {}
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": runtime, "rootfs": {"type": "layers"}}
    )
    config_name = hashlib.sha256(config.encode()).hexdigest() + ".json"
    manifest = [
        {"Config": config_name, "RepoTags": [f"localhost/hand:{i}"], "Layers": names} for i in range(images)
    ]
    with tarfile.open(path, "w") as archive:
        for name, blob in zip(names, blobs, strict=True):
            _add_bytes(archive, name, blob)
        _add_bytes(archive, config_name, config.encode())
        _add_bytes(archive, "manifest.json", json.dumps(manifest).encode())
    return path
