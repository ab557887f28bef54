"""Inputs and outputs that travel by content, for nodes that share no file system.

A cluster node sees none of the submitter's files: a task's staged files (the model's folder, the detector
folder or its image archive, the training split) are each packed into one blob, a deterministic tar named
by its SHA-256 (``pack``), sent once per distinct hash (Ray's object store), and unpacked on the node into a
cache folder keyed by that hash (``landed``), checked before it is used. The task the node runs then names
only its own cached copies (``Shipment``); results come back as values (``TaskResult.outputs`` holds the
result files' bytes). A model the zoo trains on a node comes back the same way (``unpack_to``).

The blob is plain tar: members sorted, one fixed time, owner and mode bits, links followed and dangling ones
left out (as ``workspace.stage_in`` copies them), so equal content gives an equal hash on every machine.
Unpacking uses tarfile's ``data`` filter, so a forged blob cannot write outside its folder.

Memory: a detector image or a large model is gigabytes, so a blob is never held as ``bytes`` on its way.
``pack_into`` writes it to a file; the executor maps that file into Ray's object store, and a node reads
the store's shared memory in place (``_extract`` takes any buffer). ``pack`` (bytes) is for the zoo's small
models coming back as values. The node's cache is bounded and trimmed (``nodecache.py``); ``landed`` holds
its entries while the task runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from assay.fileio import atomic_path
from assay.runner.nodecache import cached, hold
from assay.runner.task import Task

Buffer = Any  # bytes, or any object with the buffer protocol (a numpy array Ray hands back)
ENTRY = "entry"  # the one top-level member of every blob (plus a file's suffix: .sif, .tar)
_FILE_MODES = (0o644, 0o755)


class TransferError(RuntimeError):
    """A blob whose content does not match its hash, or that is not one packed entry: never used."""


def digest(blob: Buffer) -> str:
    """The content address of a blob: its SHA-256, hex."""
    return hashlib.sha256(memoryview(blob).cast("B")).hexdigest()


class _Reader(io.RawIOBase):
    """A read-only, seekable file over a buffer, without copying it (``io.BytesIO`` copies)."""

    def __init__(self, blob: Buffer) -> None:
        self._view = memoryview(blob).cast("B")
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, into: Any) -> int:
        count = max(0, min(len(into), len(self._view) - self._at))
        into[:count] = self._view[self._at : self._at + count]
        self._at += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._view)}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at


def _info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add(tar: tarfile.TarFile, path: Path, name: str) -> None:
    """One file or folder, children sorted; links followed, dangling links and special files left out."""
    if path.is_dir():
        tar.addfile(_info(name, tarfile.DIRTYPE, 0o755))
        for child in sorted(path.iterdir(), key=lambda p: p.name):
            _add(tar, child, f"{name}/{child.name}")
    elif path.is_file():
        executable = os.access(path, os.X_OK)
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            tar.addfile(_info(name, tarfile.REGTYPE, _FILE_MODES[executable], size), handle)


def entry_name(source: Path) -> str:
    """The name a source gets in its blob: neutral (nothing of the model's name), a file's suffix kept
    because container runners tell ``.sif`` from a tar archive by it."""
    return ENTRY + (source.suffix if source.is_file() else "")


def _write(source: Path, target: IO[bytes]) -> None:
    with tarfile.open(fileobj=target, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, source, entry_name(source))


def pack(source: str | Path) -> bytes:
    """A file or folder as one deterministic tar blob, in memory (see the module docstring)."""
    buffer = io.BytesIO()
    _write(Path(source).resolve(), buffer)
    return buffer.getvalue()


def pack_into(source: str | Path, folder: Path) -> tuple[str, Path]:
    """``pack(source)`` written to a new file in ``folder`` instead of memory: its hash and the file."""
    handle, name = tempfile.mkstemp(prefix="blob-", suffix=".tar", dir=folder)
    with os.fdopen(handle, "w+b") as target:
        _write(Path(source).resolve(), target)
        target.seek(0)
        found = hashlib.file_digest(target, "sha256").hexdigest()
    return found, Path(name)


def _extract(blob: Buffer, expected: str, into: Path) -> Path:
    """Check the blob against its hash and unpack it into the empty folder ``into``; its one entry."""
    if digest(blob) != expected:
        raise TransferError(f"blob {expected[:12]}: content does not match its hash; refused")
    with tarfile.open(fileobj=_Reader(blob), mode="r:") as tar:
        tops = {member.name.split("/", 1)[0] for member in tar.getmembers()}
        if len(tops) != 1 or not next(iter(tops)).startswith(ENTRY):
            raise TransferError(f"blob {expected[:12]}: not one packed entry ({sorted(tops)[:3]})")
        try:
            tar.extractall(into, filter="data")
        except tarfile.FilterError as err:  # a member pointing outside, a link, a device
            raise TransferError(f"blob {expected[:12]}: {err}; refused") from None
    return into / tops.pop()


def unpack_cached(blob: Buffer, expected: str, cache: Path) -> Path:
    """Unpack a checked blob into ``cache/HASH/`` once; two tasks of a node racing for it both end up
    with the same folder (the loser's copy is dropped)."""
    found = cached(expected, cache)
    if found is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=".part-", dir=cache))
    try:
        _extract(blob, expected, part)
        with contextlib.suppress(OSError):  # another task of this node renamed its copy first
            os.rename(part, cache / expected)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    found = cached(expected, cache)
    if found is None:
        raise TransferError(f"blob {expected[:12]}: could not be unpacked into {cache}")
    return found


def unpack_to(blob: Buffer, expected: str, target: Path) -> None:
    """Unpack a checked blob's entry as ``target`` (a file or folder), atomically: all or nothing."""
    with atomic_path(target) as tmp:
        tmp.mkdir()
        entry = _extract(blob, expected, tmp)
        moved = tmp.with_name(tmp.name + ".entry")
        os.rename(entry, moved)
        shutil.rmtree(tmp)
        os.rename(moved, tmp)


@dataclass(frozen=True)
class Shipment:
    """A task with no path of the submitter in it: its staged entries and image archive by hash only."""

    task: Task  # stage and image emptied
    stage: dict[str, str]  # stage name -> blob hash
    shared: frozenset[str] = frozenset()  # the task's ``shared_stage``
    image: str | None = None  # blob hash of an image archive file; None: ``task.image`` as it is


def ship(task: Task, packed: Callable[[Path], str]) -> Shipment:
    """The shipment of ``task``; ``packed(path)`` packs a source and returns its hash.

    An image given as ``podman:REF`` names an image in each node's own storage and is left as it is.
    """
    stage = {name: packed(Path(source)) for name, source in task.stage.items()}
    image = packed(Path(task.image)) if task.image is not None and Path(task.image).is_file() else None
    bare = dataclasses.replace(task, stage={}, shared_stage=frozenset(), image=None if image else task.image)
    return Shipment(bare, stage, task.shared_stage, image)


def signature(path: Path) -> tuple:
    """What tells whether a packed source may have changed: every file's relative path, size and
    modification time (links followed, as ``pack`` follows them). Far cheaper than packing it again."""
    if not path.is_dir():
        info = path.stat()
        return ((".", info.st_size, info.st_mtime_ns),)
    found = []
    for top, dirs, files in os.walk(path, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            with contextlib.suppress(OSError):  # a dangling link: left out, as pack leaves it out
                info = os.stat(os.path.join(top, name))
                found.append((os.path.relpath(os.path.join(top, name), path), info.st_size, info.st_mtime_ns))
    return tuple(found)


def ship_all(
    tasks: list[Task], spool: Path, known: dict[tuple[Path, tuple], str] | None = None
) -> tuple[list[Shipment], dict[str, Path]]:
    """Shipments of ``tasks`` and the blob files packed for them into ``spool``, by hash; each source path
    packed once, each hash kept once.

    ``known`` maps (path, ``signature``) to the hash it packed to before; a source found there unchanged is
    not packed again (its blob is not in the answer: the caller has it), and new ones are added to it.
    """
    known = {} if known is None else known
    blobs: dict[str, Path] = {}

    def packed(path: Path) -> str:
        key = (path.resolve(), signature(path.resolve()))
        if key not in known:
            known[key], file = pack_into(key[0], spool)
            if blobs.setdefault(known[key], file) != file:
                file.unlink()  # the same content from another path
        return known[key]

    return [ship(task, packed) for task in tasks], blobs


@contextlib.contextmanager
def landed(shipment: Shipment, fetch: Callable[[str], Buffer], cache: Path) -> Iterator[Task]:
    """The task to run on this node: every blob unpacked into ``cache`` (``fetch(hash)`` asked only for
    those not there yet) and the stage pointing at those local copies, which no trim of the cache removes
    before the block ends."""
    hashes = [*shipment.stage.values(), *([shipment.image] if shipment.image else [])]
    with contextlib.ExitStack() as held:
        for expected in sorted(set(hashes)):  # one order everywhere
            held.enter_context(hold(cache, expected))

        def local(expected: str) -> Path:
            return cached(expected, cache) or unpack_cached(fetch(expected), expected, cache)

        stage = {name: local(expected) for name, expected in shipment.stage.items()}
        image = str(local(shipment.image)) if shipment.image else shipment.task.image
        yield dataclasses.replace(shipment.task, stage=stage, shared_stage=shipment.shared, image=image)
