"""Backups an operator can schedule (issue 36, item 5): a backup never holds an earlier one, and a backup or
restore that is killed or stopped leaves nothing behind for long.

- A target inside ``ASSAY_HOME`` is refused in one line (exit 2): the next backup would contain it, and the
  one after both (deploy.md's old example grew 2.1 -> 8.4 MiB). Earlier backups already lying there (written
  by that example) are skipped, so a second backup into the documented place is the size of the first.
- A run killed with SIGKILL leaves its staging folder (and the half-written tar or database beside its
  target); the next run removes those no live run holds (each run holds an flock on its folder), and leaves a
  concurrent run's alone.
- SIGTERM stops a backup or restore from the command line at once, removes what it had written, and exits
  143 with one line.

The killed and stopped runs are real ``assay admin`` processes paused at a chosen step (``DRIVER``), so the
signal arrives at a known point, not after a guessed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from assay.store import backup as backup_module
from assay.store import open_store
from assay.store.backup import backup, restore

# An `assay` process that pauses (prints "paused", sleeps) when it reaches backup.STEP, then carries on.
DRIVER = r"""
import sys, time
from assay.store import backup as module
step = sys.argv[1]
real = getattr(module, step)
def paused(*args, **kwargs):
    print("paused", flush=True)
    time.sleep(120)
    return real(*args, **kwargs)
setattr(module, step, paused)
from assay.cli import main
sys.argv = ["assay", *sys.argv[2:]]
main()
"""


def _instance(root: Path) -> tuple[Path, str]:
    """An instance laid out as the image lays it out: ``var/lib/assay`` with its SQLite database and 1 MiB
    of round data (random, so the tar does not shrink it)."""
    home = root / "var" / "lib" / "assay"
    url = f"sqlite:///{home / 'assay.db'}"
    open_store(url)
    (home / "rounds" / "r1").mkdir(parents=True)
    (home / "rounds" / "r1" / "models.bin").write_bytes(os.urandom(2**20))
    return home, url


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "ASSAY_HOME": str(home)}
    env.pop("ASSAY_DB_URL", None)
    return env


def _cli(home: Path, *args: str) -> tuple[int, str]:
    """``assay admin ARGS`` as an operator's cron job runs it: its exit code, stdout and stderr."""
    assay = Path(sys.executable).parent / "assay"
    done = subprocess.run(
        [assay, "admin", *args], env=_env(home), capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr


def _leftovers(*folders: Path) -> list[str]:
    """Staging folders and partial files of ours under ``folders``."""
    prefixes = (".backup-", ".restore-", ".assay-partial-")
    return sorted(p.name for f in folders if f.is_dir() for p in f.iterdir() if p.name.startswith(prefixes))


@contextmanager
def _paused(step: str, home: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``assay admin ARGS`` in its own process, stopped at ``step``; killed at the end if still running."""
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, step, "admin", *args],
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == "paused\n", line + process.communicate(timeout=30)[1]
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


# ---- a backup never holds an earlier one -------------------------------------------------------------


def test_a_backup_inside_assay_home_is_refused_in_one_line(tmp_path: Path) -> None:
    home, _ = _instance(tmp_path)
    code, output = _cli(home, "backup", str(home / "backup.tar"))
    assert code == 2, output
    assert len(output.strip().splitlines()) == 1 and "inside ASSAY_HOME" in output
    assert not (home / "backup.tar").exists() and _leftovers(home) == []
    # a link to a folder inside is inside too
    (tmp_path / "backups").symlink_to(home / "rounds")
    assert _cli(home, "backup", str(tmp_path / "backups" / "b.tar"))[0] == 2


def test_a_second_scheduled_backup_is_the_size_of_the_first(tmp_path: Path) -> None:
    """Nightly backups into the documented place (a folder beside ASSAY_HOME, never in it) stay the same
    size; one that an older release's example left inside ASSAY_HOME is skipped, not nested."""
    home, _ = _instance(tmp_path)
    backups = tmp_path / "var" / "lib" / "assay-backups"
    sizes = []
    for night in (1, 2):
        code, output = _cli(home, "backup", str(backups / f"assay-{night}.tar"))
        assert code == 0, output
        sizes.append((backups / f"assay-{night}.tar").stat().st_size)
    (home / "backup.tar").write_bytes((backups / "assay-2.tar").read_bytes())  # what the old example did
    code, output = _cli(home, "backup", str(backups / "assay-3.tar"), "--json")
    assert code == 0, output
    sizes.append((backups / "assay-3.tar").stat().st_size)
    assert sizes[0] > 2**20
    assert max(sizes) <= 1.03 * min(sizes), sizes
    with tarfile.open(backups / "assay-3.tar") as archive:
        assert "home/backup.tar" not in archive.getnames()
    assert '"skipped_backups"' in output and "backup.tar" in output
    assert _leftovers(home, backups) == []


# ---- killed and stopped runs leave nothing behind ----------------------------------------------------


def test_a_killed_backup_leaves_staging_that_the_next_backup_removes(tmp_path: Path) -> None:
    home, url = _instance(tmp_path)
    backups = tmp_path / "backups"
    with _paused("_bytes", home, "backup", str(backups / "killed.tar")) as process:  # tar half-written
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    left = _leftovers(home, backups)
    assert any(n.startswith(".backup-") for n in left) and any(n.startswith(".assay-partial-") for n in left)
    old, new = home / ".backup-from-an-older-release", home / ".backup-just-made"  # no lock inside either
    old.mkdir()
    new.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    with backup_module.held_folder(home, ".backup-") as live:  # a concurrent run's staging: kept
        report = backup(url, home, backups / "next.tar")
        assert live.is_dir()
        assert _leftovers(home, backups) == sorted([live.name, new.name])
    assert len(report.removed_stale) == len(left) + 1 and str(old) in report.removed_stale
    assert not (backups / "killed.tar").exists()


def test_sigterm_mid_backup_leaves_nothing_half_written(tmp_path: Path) -> None:
    home, _ = _instance(tmp_path)
    backups = tmp_path / "backups"
    with _paused("_bytes", home, "backup", str(backups / "stopped.tar")) as process:
        assert _leftovers(home, backups)  # mid-way: staging and a partial tar exist
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 143, err
    assert "stopped by SIGTERM" in err and len(err.strip().splitlines()) == 1, err
    assert not backups.exists() or list(backups.iterdir()) == []
    assert _leftovers(home) == []


def test_a_killed_restore_is_cleaned_by_the_next_and_sigterm_undoes_a_restore(tmp_path: Path) -> None:
    home, url = _instance(tmp_path)
    backup(url, home, tmp_path / "b.tar")
    target, home2 = tmp_path / "restored" / "assay.db", tmp_path / "home2"
    args = ("restore", str(tmp_path / "b.tar"), "--db", f"sqlite:///{target}", "--home", str(home2))
    with _paused("_extract", home2, *args) as process:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    killed = _leftovers(home2)
    assert [n[:9] for n in killed] == [".restore-"]

    with _paused("copy_rows", home2, *args) as process:  # files moved in, database half-copied
        assert killed[0] not in _leftovers(home2)  # the killed run's staging is gone
        assert (home2 / "rounds").is_dir()
        assert _leftovers(target.parent)  # the database is written beside its place, then renamed
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 143, err
    assert "stopped by SIGTERM" in err
    assert not target.exists() and _leftovers(home2, target.parent) == []
    assert not (home2 / "rounds").exists()  # nothing half-restored
    restore(tmp_path / "b.tar", f"sqlite:///{target}", home2)  # and the restore can simply be run again
    assert (home2 / "rounds" / "r1" / "models.bin").stat().st_size == 2**20
