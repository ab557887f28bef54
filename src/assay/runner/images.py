"""Read an OCI image archive without a container engine: what ``podman save`` and ``docker save`` write.

Two layouts, told apart by their top-level files: a docker-archive (``manifest.json`` listing each image's
config and layer tars) and an oci-archive (``oci-layout`` and ``index.json``, pointing at a manifest, the
config and the layer blobs, usually gzip-compressed). The leaderboard reads a submitted archive to accept
or refuse it (one image, an entrypoint, its unpacked size, its ``/metaparameters.json``); the container
runner reads the image's ID, the SHA-256 of its config, which is the ID podman gives the loaded image, so a
job finds an archive it loaded before without loading it again.

Archives are read as streams (two passes: the small JSON files, then the layers), so a gzip-compressed
archive works, nothing is ever written to disk, and memory stays bounded whatever the image's size or
number of files (``_streamed``: tarfile would otherwise keep every header it has read). Nothing here
trusts the archive: every JSON field is checked, and anything malformed is a ``UserError`` naming the
archive.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from assay.errors import UserError

DOCKER_ARCHIVE = "docker-archive"
OCI_ARCHIVE = "oci-archive"
_SMALL_BYTES = 1 * 2**20  # manifests, indexes and configs are kilobytes; anything larger is a layer
_SMALL_TOTAL = 32 * 2**20  # what pass one keeps in memory at most
_ROOT_FILE_BYTES = 1 * 2**20  # a metaparameters file larger than this is not read
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_OPAQUE = ".wh..wh..opq"
_WHITEOUT = ".wh."


@dataclass(frozen=True)
class ImageArchive:
    """What a single-image archive holds, as far as running and judging it goes.

    ``image_id`` is ``sha256:<hex>`` of the config. ``entrypoint`` and ``cmd`` are the image's own (either may
    be empty). ``unpacked_bytes`` is the sum of the layers' file sizes: roughly what loading it writes to
    disk. ``root_files`` maps each requested top-level file of the image's file system to its bytes, or to
    None when it is there but not a regular file or too large; absent names are absent from the image.
    """

    format: str
    image_id: str
    entrypoint: list[str]
    cmd: list[str]
    unpacked_bytes: int = 0
    root_files: dict[str, bytes | None] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)  # the config's ``Env``, ``NAME=value`` each

    @property
    def command(self) -> list[str]:
        """What runs when arguments are given: the entrypoint, or the command when there is no entrypoint."""
        return self.entrypoint or self.cmd


def _name(member_name: str) -> str:
    """A member's path without ``./`` or ``/`` in front: archives write either."""
    return posixpath.normpath(member_name.lstrip("/")).removeprefix("./")


def _streamed(archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members of a stream-mode archive one by one, each forgotten once the next is read: tarfile keeps
    every header in ``members``, tens of MiB for a layer of 100,000 files (an image with torch has 15,000
    in one layer)."""
    for member in archive:
        yield member
        archive.members.clear()


def _open(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r|*")
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"{path}: not a readable tar archive ({exc})") from None


def archive_format(path: Path) -> str | None:
    """``docker-archive``, ``oci-archive``, or None when ``path`` is no image archive (a detector folder's
    tar, say, even one with a ``manifest.json`` of its own beside its ``entrypoint.py``). Only the top-level
    names are looked at."""
    names = set()
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                names.add(_name(member.name))
    except (tarfile.TarError, OSError, EOFError):
        return None
    if "entrypoint.py" in names:  # never at an image archive's top: its files are blobs and manifests
        return None
    if "oci-layout" in names and "index.json" in names:
        return OCI_ARCHIVE
    if "manifest.json" in names:
        return DOCKER_ARCHIVE
    return None


def _small_files(path: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """Pass one: every small regular file by name (manifests, indexes, configs), and links by name -> target
    (``docker save`` links duplicate layers)."""
    small: dict[str, bytes] = {}
    links: dict[str, str] = {}
    kept = 0
    with _open(path) as archive:
        try:
            for member in _streamed(archive):
                name = _name(member.name)
                if member.issym():
                    links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
                elif member.islnk():
                    links[name] = _name(member.linkname)
                elif member.isfile() and member.size <= _SMALL_BYTES and kept + member.size <= _SMALL_TOTAL:
                    handle = archive.extractfile(member)
                    if handle is not None:
                        small[name] = handle.read()
                        kept += member.size
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UserError(f"{path}: a damaged image archive ({exc})") from None
    return small, links


def _json(path: Path, small: dict[str, bytes], name: str, what: str) -> Any:
    if name not in small:
        raise UserError(f"{path}: the image archive has no {what} ({name})")
    try:
        return json.loads(small[name])
    except ValueError:
        raise UserError(f"{path}: the image archive's {what} ({name}) is not JSON") from None


def _blob(digest: Any, path: Path) -> str:
    """The archive path of an OCI blob, from a descriptor's ``sha256:<hex>`` digest."""
    if not isinstance(digest, str) or not digest.startswith("sha256:") or "/" in digest:
        raise UserError(f"{path}: the image archive names a blob by an unsupported digest ({digest!r})")
    return f"blobs/sha256/{digest.removeprefix('sha256:')}"


def _one(items: Any, path: Path, what: str) -> Any:
    if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], dict):
        count = len(items) if isinstance(items, list) else 0
        raise UserError(f"{path}: the archive holds {count} {what}; submit an archive of exactly one image")
    return items[0]


def _docker_layout(path: Path, small: dict[str, bytes]) -> tuple[str, list[str]]:
    """The config's member name and the layer member names of a docker-archive."""
    entry = _one(_json(path, small, "manifest.json", "manifest"), path, "images")
    config, layers = entry.get("Config"), entry.get("Layers")
    if (
        not isinstance(config, str)
        or not isinstance(layers, list)
        or not all(isinstance(x, str) for x in layers)
    ):
        raise UserError(f"{path}: manifest.json does not name a config and its layers")
    return _name(config), [_name(layer) for layer in layers]


def _oci_layout(path: Path, small: dict[str, bytes]) -> tuple[str, list[str]]:
    """The config's member name and the layer member names of an oci-archive (through nested indexes)."""
    document = _json(path, small, "index.json", "index")
    for _ in range(4):  # index -> (index ->) manifest
        descriptor = _one(document.get("manifests"), path, "manifests")
        document = _json(path, small, _blob(descriptor.get("digest"), path), "manifest")
        if document.get("mediaType") not in _INDEX_TYPES and "manifests" not in document:
            break
    config, layers = document.get("config"), document.get("layers")
    if not isinstance(config, dict) or not isinstance(layers, list):
        raise UserError(f"{path}: the image manifest does not name a config and its layers")
    return _blob(config.get("digest"), path), [_blob(layer.get("digest"), path) for layer in layers]


def _strings(value: Any) -> list[str]:
    """An entrypoint or command as a list of strings (null, or anything else malformed, is empty)."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    return []


@dataclass
class _Layer:
    """What one layer does to the root of the file system: files it adds, names it deletes."""

    files: dict[str, bytes | None] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    opaque: bool = False


def _read_layer(handle: IO[bytes], wanted: frozenset[str], budget: int, path: Path) -> tuple[_Layer, int]:
    """Stream one layer (plain or compressed tar): its effect on the wanted root files, and its bytes."""
    layer, total = _Layer(), 0
    try:
        with tarfile.open(fileobj=handle, mode="r|*") as archive:
            for member in _streamed(archive):
                total += member.size
                if total > budget:
                    break
                name = _name(member.name)
                if "/" in name:
                    continue
                if name == _OPAQUE:
                    layer.opaque = True
                elif name.startswith(_WHITEOUT) and name[len(_WHITEOUT) :] in wanted:
                    layer.deleted.add(name[len(_WHITEOUT) :])
                elif name in wanted:
                    readable = member.isfile() and member.size <= _ROOT_FILE_BYTES
                    data = archive.extractfile(member) if readable else None
                    layer.files[name] = data.read() if data is not None else None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UserError(
            f"{path}: a layer cannot be read ({exc}); save the image uncompressed or gzip-compressed "
            "(podman save --format docker-archive)"
        ) from None
    return layer, total


def _read_layers(
    path: Path, layers: list[str], links: dict[str, str], wanted: frozenset[str], max_bytes: int
) -> tuple[dict[str, bytes | None], int]:
    """Pass two: each layer once, in archive order; then the root files as the top layer leaves them."""
    real = [links.get(name, name) for name in layers]
    effects: dict[str, _Layer] = {}
    total = 0
    with _open(path) as archive:
        try:
            for member in _streamed(archive):
                name = _name(member.name)
                if name not in real or name in effects or not member.isfile():
                    continue
                handle = archive.extractfile(member)
                assert handle is not None
                effects[name], size = _read_layer(handle, wanted, max_bytes - total, path)
                total += size
                if total > max_bytes:
                    raise UserError(
                        f"{path}: the image unpacks to more than {max_bytes} bytes; the limit is {max_bytes}"
                    )
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UserError(f"{path}: a damaged image archive ({exc})") from None
    missing = [name for name in real if name not in effects]
    if missing:
        raise UserError(f"{path}: the image archive lacks its layer {missing[0]}")
    files: dict[str, bytes | None] = {}
    for name in real:
        effect = effects[name]
        if effect.opaque:
            files.clear()
        for gone in effect.deleted:
            files.pop(gone, None)
        files.update(effect.files)
    return files, total


def read_archive(path: Path, wanted: Iterable[str] = (), max_bytes: int | None = None) -> ImageArchive:
    """Read the one image of the archive at ``path``: its ID, entrypoint and command; with ``max_bytes``
    also its layers (refused past that many unpacked bytes) and the ``wanted`` files at the root of its file
    system. A ``UserError`` says what is wrong with the archive."""
    kind = archive_format(path)
    if kind is None:
        raise UserError(f"{path}: not an image archive (no manifest.json, or oci-layout and index.json)")
    small, links = _small_files(path)
    config_name, layers = (_oci_layout if kind == OCI_ARCHIVE else _docker_layout)(path, small)
    config_name = links.get(config_name, config_name)
    config = _json(path, small, config_name, "config")
    if not isinstance(config, dict):
        raise UserError(f"{path}: the image config is not a JSON object")
    runtime = config.get("config") if isinstance(config.get("config"), dict) else {}
    image_id = "sha256:" + hashlib.sha256(small[config_name]).hexdigest()
    found: dict[str, bytes | None] = {}
    unpacked = 0
    if max_bytes is not None:
        found, unpacked = _read_layers(path, layers, links, frozenset(wanted), max_bytes)
    entrypoint, cmd = _strings(runtime.get("Entrypoint")), _strings(runtime.get("Cmd"))
    return ImageArchive(kind, image_id, entrypoint, cmd, unpacked, found, _strings(runtime.get("Env")))
