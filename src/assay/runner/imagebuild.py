"""Build a detector image from an Apptainer definition file with podman: ``assay leaderboard image build``.

Why: TrojAI performers hold a ``detector.def`` and no Containerfile, and no apptainer can be installed
here. ``assay.runner.deffile`` reads the file's common subset; this module writes an equivalent
Containerfile in a temporary build context (copies of the ``%files`` sources only, the scripts as files)
and runs ``podman build`` with no network (``--pull=never --network=none``), ``runc`` (``crun`` refuses
cgroups v1 hosts) and ulimits within this host's hard limits. What it keeps of apptainer's semantics:

- ``%files SRC [DEST]``: relative sources resolve against the build context (the definition file's folder
  unless ``context`` says otherwise; apptainer uses the folder ``build`` runs in), globs expand as ``sh``
  expands them, links are followed, and each source lands where ``cp -r SRC DEST`` puts it: a folder is
  copied as a folder (``./utils /`` gives ``/utils``, not a Dockerfile COPY's contents), inside ``DEST``
  when it ends in ``/`` or is a folder of the base image (asked of the image with its own ``/bin/sh``).
- ``%post`` runs as ``/bin/sh -ex`` from ``/``, after the files, with ``$APPTAINER_ENVIRONMENT`` and
  ``$SINGULARITY_ENVIRONMENT`` naming ``/.singularity.d/env/91-environment.sh``.
- ``%environment`` is ``/.singularity.d/env/90-environment.sh``, ``%runscript`` ``/.singularity.d/runscript``
  (``#!/bin/sh`` unless it has its own), ``%help`` ``/.singularity.d/runscript.help``, the definition file
  ``/.singularity.d/Singularity``; ``%labels`` become image labels.
- The image's entrypoint is ``/.singularity.d/actions/run``: every ``/.singularity.d/env/*.sh`` sourced in
  name order, then the runscript with the arguments, so ``podman run IMAGE ARGS`` (what the leaderboard runs
  for an OCI image) behaves as ``singularity run``.

``Bootstrap: docker`` needs ``From:`` in podman's local storage (no registry is reachable);
``Bootstrap: localimage`` takes a docker-archive or oci-archive, a ``.sif`` (its primary partition unpacked
with ``assay.runner.squashfs`` and imported) or a root folder. The output is a docker-archive (``.tar``,
``podman save``) or a SIF (``.sif``: the built container's root exported, the base image's environment
written to ``/.singularity.d/env/10-docker2singularity.sh`` as apptainer writes it, ``mksquashfs``, and
``sif.write_sif``). Nothing is left behind: the output is written atomically, and the built image, and any
base imported for the build, are removed from podman's storage unless ``tag`` asks to keep the image.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from assay.errors import UserError, shown
from assay.fileio import atomic_path
from assay.runner.container import RUNTIME, _call, _error_line, podman_missing, ulimit_flags
from assay.runner.deffile import (
    Definition,
    FileCopy,
    environment_file,
    parse_definition,
    post_command,
    runscript_file,
)
from assay.runner.images import archive_format, read_archive
from assay.runner.sif import check_arch, read_sif, system_partition, write_sif
from assay.runner.squashfs import unpack

FORMATS = {".tar": "docker-archive", ".sif": "sif"}
ACTIONS_RUN = "/.singularity.d/actions/run"
POST_SCRIPT = "/.post.script"
POST_ENVIRONMENT = "/.singularity.d/env/91-environment.sh"
DOCKER_ENV = ".singularity.d/env/10-docker2singularity.sh"
BUILD_TIMEOUT_S = 4 * 3600  # a %post that installs a framework takes minutes; an hour's pip is not unusual
SAVE_TIMEOUT_S = 1800
RUN_SCRIPT = """#!/bin/sh
# what `singularity run` does: the environment scripts in name order, then the runscript
for script in /.singularity.d/env/*.sh; do
    if [ -f "$script" ]; then
        . "$script"
    fi
done
exec /.singularity.d/runscript "$@"
"""
_TAG = re.compile(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?")
_ESCAPED = re.compile(r'([\\"`$])')


@dataclass(frozen=True)
class BuiltImage:
    """What was built: the output file and its format, the image's ID, size and build time, the tag kept."""

    out: Path
    format: str  # docker-archive or sif
    image_id: str
    bytes: int
    seconds: float
    base: str  # what From: was found as
    tag: str | None = None


@dataclass(frozen=True)
class _Copy:
    """A ``%files`` source and where it lands in the image (its final path, as ``cp -r`` would put it)."""

    source: Path
    final: PurePosixPath
    line: int


def _podman(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _call(["podman", "--runtime", RUNTIME, *argv], timeout)


def _format(out: Path) -> str:
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise UserError(f"{out}: the output must end in .tar (a docker-archive) or .sif (a SIF image)")
    if out.is_dir():
        raise UserError(f"{out}: a folder; name the image file to write")
    return fmt


def _tools(fmt: str) -> None:
    if reason := podman_missing():
        raise UserError(f"building an image needs podman: {reason}")
    if fmt == "sif" and shutil.which("mksquashfs") is None:
        raise UserError("writing a .sif needs mksquashfs (`make install` installs Debian's squashfs-tools)")


def _context(definition: Definition, context: Path | None) -> Path:
    folder = Path(context) if context is not None else definition.path.parent
    if not folder.is_dir():
        raise UserError(f"{folder}: the build context is not a folder")
    return folder.resolve()


# --- %files: where each source lands ------------------------------------------------------------------------


def _sources(definition: Definition, context: Path, copy: FileCopy) -> list[Path]:
    """A ``%files`` source expanded as ``sh`` expands a glob, against the context; each must exist."""
    absolute = os.path.isabs(copy.source)
    if glob.has_magic(copy.source):  # only the source's own pattern: the context's path is taken as it is
        found = sorted(glob.glob(copy.source, root_dir=None if absolute else context))
    else:
        found = [copy.source]
    found = [p if absolute else str(context / p) for p in found]
    paths = [Path(p) for p in found if os.path.exists(p)]
    if not paths:
        raise UserError(
            f"{definition.path}:{copy.line}: field '%files' source {shown(copy.source)} does not exist "
            f"(relative sources are read from {context}; --context names another folder)"
        )
    return paths


def _destination(copy: FileCopy) -> str:
    """The destination inside the image, absolute; no destination means the source's own path."""
    dest = copy.dest or copy.source
    return "/" + dest.lstrip("/") if not dest.startswith("/") else dest


def _inside(path: str) -> PurePosixPath:
    """A path inside the image with ``..`` resolved lexically, never above ``/`` (apptainer's securejoin)."""
    parts: list[str] = []
    for part in PurePosixPath(path).parts[1:]:
        if part == "..":
            parts = parts[:-1]
        elif part != ".":
            parts.append(part)
    return PurePosixPath("/", *parts)


def _probe(base: str, paths: list[str], where: str) -> set[str]:
    """Which of ``paths`` are folders in the base image, asked of its own ``/bin/sh`` (which ``%post`` and
    the runscript need anyway: an image without one is refused here, before building)."""
    script = 'for p in "$@"; do if [ -d "$p" ]; then printf "%s\\n" "$p"; fi; done'
    done = _podman(
        "run", "--rm", "--pull", "never", "--network", "none", *ulimit_flags(),
        "--entrypoint", "/bin/sh", base, "-c", script, "probe", *paths,
    )  # fmt: skip
    if done.returncode != 0:
        raise UserError(
            f"{where}: the base image cannot run /bin/sh, which %post and the runscript need "
            f"({_error_line(done)})"
        )
    return set(done.stdout.splitlines())


def expand_sources(definition: Definition, context: Path) -> list[tuple[FileCopy, list[Path]]]:
    """Every ``%files`` line with the host paths it names (checked before any image is touched)."""
    return [(copy, _sources(definition, context, copy)) for copy in definition.files]


def plan_copies(
    definition: Definition, expanded: list[tuple[FileCopy, list[Path]]], base: str
) -> list[_Copy]:
    """Every ``%files`` source with its final path in the image, as ``cp -fLr SRC DEST`` would copy it."""
    wanted = sorted({str(_inside(_destination(copy))) for copy, _ in expanded} | {"/"})
    folders = _probe(base, wanted, f"{definition.path}:{definition.from_line}")
    planned = []
    for copy, sources in expanded:
        raw = _destination(copy)
        dest = _inside(raw)
        into = raw.endswith("/") or str(dest) in folders
        if len(sources) > 1 and not into:
            raise UserError(
                f"{definition.path}:{copy.line}: field '%files' source {shown(copy.source)} matches "
                f"{len(sources)} paths; give a folder destination ending in '/'"
            )
        for source in sources:
            final = dest / source.name if into else dest
            if final == PurePosixPath("/"):
                raise UserError(f"{definition.path}:{copy.line}: field '%files' cannot replace the root '/'")
            planned.append(_Copy(source, final, copy.line))
            folders.update(str(p) for p in final.parents)
            if source.is_dir():
                folders.add(str(final))
        if raw.endswith("/"):
            folders.add(str(dest))
    return planned


# --- the build context --------------------------------------------------------------------------------------


def _stage(copy: _Copy, target: Path, where: str) -> None:
    """Copy a source into the build context with links followed (``cp -L``)."""
    try:
        if copy.source.is_dir():
            shutil.copytree(copy.source, target, symlinks=False)
        else:
            shutil.copy2(copy.source, target)
    except (OSError, shutil.Error) as exc:
        raise UserError(f"{where}:{copy.line}: field '%files' cannot copy {copy.source}: {exc}") from None


def _write(path: Path, text: str, mode: int = 0o755) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _metadata(definition: Definition, folder: Path) -> None:
    """``/.singularity.d`` as apptainer lays it out: runscript, environment, help, the definition file and
    the ``run`` action that the image's entrypoint is."""
    _write(folder / "actions" / "run", RUN_SCRIPT)
    _write(folder / "runscript", runscript_file(definition.runscript))
    if definition.environment.strip():
        _write(folder / "env" / "90-environment.sh", environment_file(definition.environment))
    if definition.help.strip():
        _write(folder / "runscript.help", definition.help + "\n", 0o644)
    _write(folder / "Singularity", definition.raw, 0o644)
    _write(folder / "labels.json", json.dumps(dict(definition.labels), indent=1) + "\n", 0o644)


def containerfile(definition: Definition, base: str, copies: list[_Copy]) -> str:
    """The Containerfile that does what the definition file asks, over a context written by ``_context``."""
    lines = [f"FROM {base}", "USER 0:0"]  # apptainer copies files and runs %post as root (or fakeroot)
    for number, copy in enumerate(copies):
        lines.append(f"COPY {json.dumps([f'files/{number}/', str(copy.final.parent) + '/'])}")
    lines.append("WORKDIR /")
    if definition.post is not None:
        env = f"export APPTAINER_ENVIRONMENT={POST_ENVIRONMENT} SINGULARITY_ENVIRONMENT={POST_ENVIRONMENT}"
        argv = ["/bin/sh", "-c", f'{env}; exec "$@"', "post", *post_command(definition.post, POST_SCRIPT)]
        lines.append(f"RUN --mount=type=bind,src=post.sh,dst={POST_SCRIPT} {json.dumps(argv)}")
    lines.append('COPY ["singularity.d/", "/.singularity.d/"]')
    lines.append(f"ENTRYPOINT {json.dumps([ACTIONS_RUN])}")
    lines.append("CMD []")
    return "\n".join(lines) + "\n"


def write_context(folder: Path, definition: Definition, base: str, copies: list[_Copy]) -> Path:
    """The build context: the ``%files`` sources (each under ``files/N/`` by its final name), the scripts,
    ``/.singularity.d``'s files and the Containerfile. Nothing else of the context folder is sent."""
    folder.mkdir(parents=True)
    for number, copy in enumerate(copies):
        (folder / "files" / str(number)).mkdir(parents=True)
        _stage(copy, folder / "files" / str(number) / copy.final.name, str(definition.path))
    if definition.post is not None:
        _write(folder / "post.sh", definition.post.text + "\n")
    _metadata(definition, folder / "singularity.d")
    (folder / "Containerfile").write_text(containerfile(definition, base, copies))
    return folder


# --- the base image -----------------------------------------------------------------------------------------


def docker_name(ref: str) -> str:
    """A Docker Hub short name as a full reference (``pytorch/pytorch:1`` -> ``docker.io/pytorch/pytorch:1``,
    ``ubuntu`` -> ``docker.io/library/ubuntu``), as ``Bootstrap: docker`` means it; a name with a registry
    (a first part with a dot or port, or ``localhost``) is kept."""
    ref = ref.removeprefix("docker://")
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref}" if "/" in ref else f"docker.io/library/{ref}"


def _image_id(ref: str) -> str | None:
    done = _podman("image", "inspect", "--format", "{{.Id}}", ref)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def _names(image_id: str) -> set[str]:
    done = _podman("image", "inspect", "--format", "{{json .RepoTags}}", image_id)
    if done.returncode != 0:
        return set()
    return set(json.loads(done.stdout or "null") or [])


def _remove(image_id: str) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        _podman("rmi", "--force", image_id, timeout=300)


def _docker_base(definition: Definition) -> str:
    ref = definition.source.removeprefix("docker://")
    for candidate in dict.fromkeys((ref, docker_name(ref))):
        if (found := _image_id(candidate)) is not None:
            return found
    raise UserError(
        f"{definition.path}:{definition.from_line}: field 'From' image {shown(ref)} is not in podman's local "
        f"storage and no registry is reachable from here; load it first (podman load -i IMAGE.tar, then "
        f"podman tag IMAGE {docker_name(ref)})"
    )


def _import_root(root: Path, scratch: Path, stack: contextlib.ExitStack) -> str:
    """A root folder as an untagged image (removed again when the build is done)."""
    archive = scratch / "base-root.tar"
    done = subprocess.run(
        ["tar", "--numeric-owner", "-C", str(root), "-cf", str(archive), "."],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise UserError(f"{root}: cannot read the base root folder ({_error_line(done)})")
    imported = _podman("import", "--quiet", str(archive), timeout=1800)
    archive.unlink()
    if imported.returncode != 0:
        raise UserError(f"{root}: podman could not import it ({_error_line(imported)})")
    image_id = imported.stdout.strip().removeprefix("sha256:")
    stack.callback(_remove, image_id)
    return image_id


def _archive_base(path: Path, stack: contextlib.ExitStack) -> str:
    """A docker- or oci-archive loaded into podman's storage for the build; the names loading gives it are
    taken away again afterwards, and the image too when it was not there before."""
    image_id = read_archive(path).image_id.removeprefix("sha256:")
    before = _names(image_id) if _image_id(image_id) else None

    def restore() -> None:
        if before is None:
            _remove(image_id)
            return
        for name in _names(image_id) - before:
            _podman("untag", image_id, name)

    stack.callback(restore)
    done = _podman("load", "--quiet", "--input", str(path), timeout=1800)
    if done.returncode != 0 or _image_id(image_id) is None:
        raise UserError(f"{path}: podman could not load it ({_error_line(done)})")
    return image_id


def _local_base(definition: Definition, context: Path, scratch: Path, stack: contextlib.ExitStack) -> str:
    where = f"{definition.path}:{definition.from_line}"
    path = Path(definition.source)
    path = path if path.is_absolute() else context / path
    if path.is_dir():
        return _import_root(path, scratch, stack)
    if not path.is_file():
        raise UserError(f"{where}: field 'From' {shown(definition.source)}: no such image file or folder")
    if path.suffix.lower() in (".sif", ".simg"):
        image = read_sif(path)
        partition = system_partition(image)
        check_arch(image, partition)
        root = scratch / "base-root"
        unpack(path, partition.offset, root, None)
        return _import_root(root, scratch, stack)
    fmt = archive_format(path)
    if fmt is None:
        raise UserError(
            f"{where}: field 'From' {shown(definition.source)} is not a docker-archive, oci-archive, .sif "
            "or root folder"
        )
    return _archive_base(path, stack)


def base_image(definition: Definition, context: Path, scratch: Path, stack: contextlib.ExitStack) -> str:
    """The ID of the image ``FROM`` names for this build, in podman's local storage."""
    if definition.bootstrap == "docker":
        return _docker_base(definition)
    return _local_base(definition, context, scratch, stack)


# --- build and save -----------------------------------------------------------------------------------------


def _build(folder: Path, definition: Definition, tag: str | None) -> str:
    """``podman build`` of the context; the new image's ID. A failing ``%post`` is the definition's fault."""
    argv = ["build", "--pull=never", "--network=none", "--layers=false", "--quiet", *ulimit_flags()]
    argv += ["--iidfile", str(folder.parent / "image-id"), "--file", str(folder / "Containerfile")]
    for key, value in definition.labels:
        argv += ["--label", f"{key}={value}"]
    if tag:
        argv += ["--tag", tag]
    done = _podman(*argv, str(folder), timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise UserError(f"{definition.path}: podman build failed: {_error_line(done)}")
    return (folder.parent / "image-id").read_text().strip().removeprefix("sha256:")


def _env_script(image_id: str) -> str:
    """The image's ``ENV`` as apptainer writes it for a docker base (``10-docker2singularity.sh``)."""
    done = _podman("image", "inspect", "--format", "{{json .Config.Env}}", image_id)
    lines = ["#!/bin/sh"]
    for item in json.loads(done.stdout or "null") or []:
        name, sep, value = item.partition("=")
        escaped = _ESCAPED.sub(r"\\\1", value)
        lines.append(f'export {name}="{escaped}"' if sep else f"export {name}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _container(image_id: str) -> Iterator[str]:
    done = _podman("create", "--pull", "never", image_id)
    if done.returncode != 0:
        raise UserError(f"podman could not create a container of the built image: {_error_line(done)}")
    name = done.stdout.strip()
    try:
        yield name
    finally:
        _podman("rm", "--force", name)


def _save_sif(image_id: str, target: Path, definition: Definition, scratch: Path) -> None:
    """The built image's root as a SIF: exported, its base's ``ENV`` written as apptainer writes it,
    squashed and wrapped with the definition file."""
    exported, root, squashed = scratch / "export.tar", scratch / "sif-root", scratch / "root.squashfs"
    with _container(image_id) as name:
        done = _podman("export", "--output", str(exported), name, timeout=SAVE_TIMEOUT_S)
    if done.returncode != 0:
        raise UserError(f"podman could not export the built image: {_error_line(done)}")
    root.mkdir()
    for argv in (
        ["tar", "--numeric-owner", "-C", str(root), "-xpf", str(exported)],
        ["mksquashfs", str(root), str(squashed), "-noappend", "-quiet", "-no-progress", "-no-xattrs"]
        + ([] if os.geteuid() == 0 else ["-all-root"]),
    ):
        if argv[0] == "mksquashfs":
            exported.unlink()
            _write(root / DOCKER_ENV, _env_script(image_id))
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=SAVE_TIMEOUT_S)
        if done.returncode != 0:
            raise UserError(f"{argv[0]} failed while writing the SIF image: {_error_line(done)}")
    write_sif(target, squashed, definition.raw.encode())


def _save(image_id: str, target: Path, fmt: str, definition: Definition, scratch: Path) -> None:
    if fmt == "sif":
        _save_sif(image_id, target, definition, scratch)
        return
    done = _podman(
        "save", "--quiet", "--format", fmt, "--output", str(target), image_id, timeout=SAVE_TIMEOUT_S
    )
    if done.returncode != 0:
        raise UserError(f"podman could not save the built image: {_error_line(done)}")


def _check_tag(tag: str | None) -> None:
    if tag is not None and not _TAG.fullmatch(tag):
        raise UserError(f"--tag {shown(tag)} is not an image name (e.g. localhost/detector:1)")


def build_image(
    def_path: str | Path, out: str | Path, context: str | Path | None = None, tag: str | None = None
) -> BuiltImage:
    """Build the definition file at ``def_path`` into ``out`` (``.tar``: a docker-archive, ``.sif``: a SIF
    image); ``context`` is the folder relative ``%files`` sources are read from (the definition file's own
    by default); ``tag`` keeps the image in podman's storage under that name. Every refusal is a one-line
    ``UserError`` raised before anything is built, and a failure leaves no output file and no image."""
    started = time.monotonic()
    definition = parse_definition(def_path)
    out = Path(out)
    fmt = _format(out)
    _check_tag(tag)
    folder = _context(definition, Path(context) if context is not None else None)
    _tools(fmt)
    with tempfile.TemporaryDirectory(prefix="assay-image-build-") as tmp, contextlib.ExitStack() as stack:
        scratch = Path(tmp)
        expanded = expand_sources(definition, folder)
        base = base_image(definition, folder, scratch, stack)
        copies = plan_copies(definition, expanded, base)
        built = _build(write_context(scratch / "context", definition, base, copies), definition, tag)
        try:
            with atomic_path(out) as target:
                _save(built, target, fmt, definition, scratch)
        except BaseException:
            _remove(built)
            raise
        if tag is None:
            stack.callback(_remove, built)
    return BuiltImage(out, fmt, built, out.stat().st_size, time.monotonic() - started, base, tag)
