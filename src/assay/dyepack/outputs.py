"""Nothing lost: what a DyePack command writes never silently replaces a key, a release or an input.

Why: a key replaced after its release went public can never be revealed again (its commitment no longer
matches anything), and a verdict written over the log it was read from destroys the evidence. So every
command names its outputs up front, before any work (a draw, a query, a training step), and this module
refuses, in one line naming the file, any output that exists already or is one of the command's inputs.
With ``--force`` the existing file or folder is first copied aside with a timestamp (``NAME.STAMP.bak``)
and the command proceeds; an input is never an output, even with ``--force``.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


@dataclass(frozen=True)
class Claim:
    """The outputs a command may write, checked; ``keep_copies()`` sets aside what ``--force`` replaces."""

    replaced: tuple[Path, ...]

    def keep_copies(self, stamp: str | None = None) -> list[Path]:
        """Copy each output that exists to ``NAME.STAMP.bak`` beside it; return the copies. Call it just
        before writing, so a command that fails on the way leaves no copies behind."""
        stamp = stamp or datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S")
        return [_keep_copy(path, stamp) for path in self.replaced if path.exists()]


def _keep_copy(path: Path, stamp: str) -> Path:
    """One timestamped copy of ``path`` (a file, or a folder copied whole), never over another copy."""
    import shutil  # here: `assay dyepack --help` imports this module and has no use for shutil (5 ms)

    copy, n = path.with_name(f"{path.name}.{stamp}.bak"), 1
    while copy.exists():
        n += 1
        copy = path.with_name(f"{path.name}.{stamp}-{n}.bak")
    if path.is_dir():
        shutil.copytree(path, copy, symlinks=True)
    else:
        shutil.copy2(path, copy)
    return copy


def claim_outputs(outputs: Iterable[Path], inputs: Iterable[Path | None] = (), force: bool = False) -> Claim:
    """Check a command's outputs before it does any work.

    Refuses (one line naming the file): an output that is one of ``inputs`` (even with ``force``: the
    command would destroy what it reads), and an output that exists already unless ``force``. A folder
    counts as existing only when it holds something (``prepare --out`` into an empty folder is fine).
    """
    outputs, sources = list(outputs), [p for p in inputs if p is not None]
    for path in outputs:
        source = next((s for s in sources if _same(path, s)), None)
        if source is not None:
            raise UserError(f"{path}: the output would overwrite the input {source}; choose another --out")
    existing = tuple(p for p in outputs if p.is_file() or (p.is_dir() and any(p.iterdir())))
    if existing and not force:
        raise UserError(
            f"{existing[0]}: already exists and would be replaced; move it, choose another path, or pass "
            "--force to keep a timestamped copy and replace it"
        )
    return Claim(existing)
