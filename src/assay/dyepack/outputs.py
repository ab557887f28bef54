"""Nothing lost: what a DyePack command writes never silently replaces a key, a release or an input.

Why: a key replaced after its release went public can never be revealed again (its commitment no longer
matches anything), and a verdict written over the log it was read from destroys the evidence. So every
command names its outputs up front, before any work (a draw, a query, a training step), and one check
(``claim_outputs``, every path resolved with its links followed) refuses, in one line naming the file, an
output that exists already, is one of the command's inputs, lies inside an input folder or holds an input,
or lies in a folder nothing of the command may enter (verify: the release's folder). With ``--force`` the
existing file or folder is first kept as ``NAME.STAMP.bak`` (a hard link, else a copy, checked equal) and
the command proceeds; an input is never an output, even with ``--force``. ``Claim.replacing()`` wraps the
writes: a disk that refuses them (full, read-only) is one line, the copies removed, the previous files kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from assay.errors import UserError

KEY_SUFFIX = ".key.json"  # the default key beside the release folder: release/ -> release.key.json


def default_key_path(out_dir: Path) -> Path:
    """Where ``prepare`` keeps the key without ``--key``: beside the release folder, never inside it, so
    publishing the folder cannot publish the key (``release/`` -> ``release.key.json``)."""
    folder = out_dir.resolve()
    return folder.parent / f"{folder.name}{KEY_SUFFIX}"


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` would lie in ``folder`` (both resolved; neither need exist)."""
    return path.resolve().is_relative_to(folder.resolve())


def check_folder(out_dir: Path, option: str = "--out") -> None:
    """An output folder that is an existing file is refused: writing into it would fail after the work."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: {option} names an existing file; give a folder")


def release_folder(release: Path) -> Path | None:
    """The folder published with a release: the release itself when it is a folder (an lm-eval task, a
    folder of CSV files), else the folder of a release file that holds its ``commitment.txt``."""
    if release.is_dir():
        return release
    return release.parent if (release.parent / "commitment.txt").is_file() else None


@dataclass(frozen=True)
class Claim:
    """The outputs a command may write, checked; ``replacing()`` sets aside what ``--force`` replaces."""

    replaced: tuple[Path, ...]

    def keep_copies(self, stamp: str | None = None) -> list[Path]:
        """Keep each output that exists as ``NAME.STAMP.bak`` beside it, checked equal before anything
        is replaced; return the copies. Call it just before writing."""
        stamp = stamp or datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S")
        copies: list[Path] = []
        try:
            for path in self.replaced:
                if path.exists():
                    copies.append(_keep_copy(path, stamp))
        except OSError as exc:
            _remove(copies)
            raise disk_error(exc, "keeping a copy of what --force replaces") from None
        return copies

    @contextlib.contextmanager
    def replacing(self) -> Iterator[list[Path]]:
        """Keep copies of what is replaced (``keep_copies``), then run the writes inside the block. A write
        the disk refuses (full, read-only, no permission) is one line, and leaves the previous files as
        they were: the writes are atomic (``assay.fileio``), the copies just made are removed, as they are
        when the block fails in any other way (nothing was replaced)."""
        copies = self.keep_copies()
        try:
            yield copies
        except OSError as exc:
            _remove(copies)
            raise disk_error(exc, "writing the outputs") from None
        except BaseException:  # nothing was replaced: a copy left would share the original's file
            _remove(copies)
            raise


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


class DiskFaults:
    """A file, or an SQLite file such as the response cache, that the disk will not write (full,
    read-only, no permission) as one line naming ``where`` with a ``hint``, instead of a traceback; other
    errors (a lost connection is an OSError too) pass unchanged. Re-enterable: one object per place."""

    def __init__(self, where: Path, hint: str) -> None:
        self.where, self.hint = where, hint
        self.new = not where.exists()  # a file the refused write created empty is removed

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> bool:
        import sqlite3

        refused = isinstance(exc, sqlite3.OperationalError) and any(
            word in str(exc) for word in ("full", "readonly", "disk I/O", "unable to open")
        )
        if refused or (isinstance(exc, OSError) and exc.errno in DISK_ERRNOS):
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            for left in (self.where, Path(f"{self.where}-wal"), Path(f"{self.where}-shm")):
                if self.new and left.is_file() and left.stat().st_size == 0:
                    left.unlink()
            raise UserError(f"{self.where}: {reason}; {self.hint}") from None
        return False


def disk_error(exc: OSError, doing: str) -> UserError:
    """One line for a write the file system refused, naming the file and the reason."""
    where = exc.filename or "an output"
    return UserError(
        f"{where}: {exc.strerror or exc} while {doing}; nothing was replaced or left half-written"
    )


def _remove(paths: Iterable[Path]) -> None:
    import shutil

    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _keep_copy(path: Path, stamp: str) -> Path:
    """One timestamped copy of ``path`` (a file, or a folder copied whole), never over another copy: hard
    links where the file system has them (no space needed; every write here renames a new file into
    place, so the linked old content stays), else a copy; built under a temporary name, checked equal to
    the original, then renamed into place, so a copy that exists is whole."""
    import shutil  # here: `assay dyepack --help` imports this module and has no use for shutil (5 ms)

    copy, n = path.with_name(f"{path.name}.{stamp}.bak"), 1
    while copy.exists():
        n += 1
        copy = path.with_name(f"{path.name}.{stamp}-{n}.bak")
    tmp = path.with_name(f".{copy.name}.{secrets.token_hex(4)}.tmp")
    try:
        if path.is_dir():
            shutil.copytree(path, tmp, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(path, tmp)
        _check_copy(path, tmp)
        os.replace(tmp, copy)
    except BaseException:
        _remove([tmp])
        raise
    return copy


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    import shutil

    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
            raise
        shutil.copy2(source, target, follow_symlinks=False)


def _check_copy(original: Path, copy: Path) -> None:
    """Refuse a copy that is not byte for byte the original (every file of a folder)."""
    import filecmp

    pairs = (
        [
            (f, copy / f.relative_to(original))
            for f in original.rglob("*")
            if f.is_file() and not f.is_symlink()
        ]
        if original.is_dir()
        else [(original, copy)]
    )
    for a, b in pairs:
        if not (b.is_file() and (os.path.samefile(a, b) or filecmp.cmp(a, b, shallow=False))):
            raise OSError(errno.EIO, "the copy does not match the original", str(b))


def claim_outputs(
    outputs: Iterable[Path],
    inputs: Iterable[Path | None] = (),
    force: bool = False,
    folders: Iterable[tuple[Path | None, str]] = (),
) -> Claim:
    """Check a command's outputs before it does any work: the one check every DyePack command passes.

    Paths are compared resolved (links followed). Refuses, in one line naming the file, even with
    ``force``: an output that is one of ``inputs``, lies inside an input folder, or is a folder holding an
    input (the command would destroy what it reads), and an output inside one of ``folders`` (a folder,
    and why nothing of this command may go there). Without ``force``, an output that exists already. A
    folder counts as existing only when it holds something (``prepare --out`` into an empty folder).
    """
    outputs, sources = list(outputs), [p for p in inputs if p is not None]
    for path in outputs:
        _refuse_input(path, sources)
        for folder, why in folders:
            if folder is not None and inside(path, folder):
                raise UserError(f"{path}: lies inside {folder}, {why}; choose another --out")
    existing = tuple(p for p in outputs if p.is_file() or (p.is_dir() and any(p.iterdir())))
    if existing and not force:
        raise UserError(
            f"{existing[0]}: already exists and would be replaced; move it, choose another path, or pass "
            "--force to keep a timestamped copy and replace it"
        )
    return Claim(existing)


def _refuse_input(path: Path, sources: list[Path]) -> None:
    """Refuse an output that is an input, lies in an input folder or holds an input (resolved paths)."""
    out = path.resolve()
    for source in sources:
        real = source.resolve()
        if out == real:
            raise UserError(f"{path}: the output would overwrite the input {source}; choose another path")
        if real.is_dir() and out.is_relative_to(real):
            raise UserError(f"{path}: the output lies inside the input folder {source}; choose another path")
        if real.is_relative_to(out):
            raise UserError(f"{path}: the output would replace a folder holding the input {source}; choose "
                            "another path")  # fmt: skip
