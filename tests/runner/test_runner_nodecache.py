"""assay.runner.nodecache: a node's cache of blobs stays within its bound, oldest use first, and never loses
an entry a task (of this process or another) is using."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from assay.errors import UserError
from assay.runner.nodecache import LIMIT_ENV, STALE_SECONDS, cache_limit, cached, hold, trim
from assay.runner.transfer import digest, pack, unpack_cached


def _land(cache: Path, tmp_path: Path, name: str, size: int) -> str:
    """A blob of about ``size`` bytes unpacked into ``cache``; its hash."""
    source = tmp_path / "sources" / name
    source.parent.mkdir(exist_ok=True)
    source.write_bytes(os.urandom(size))
    blob = pack(source)
    with hold(cache, digest(blob)):
        unpack_cached(blob, digest(blob), cache)
    return digest(blob)


def _used(cache: Path, expected: str, when: float) -> None:
    os.utime(cache / expected, (when, when))


def test_trim_removes_the_entries_used_longest_ago_until_the_cache_fits(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    hashes = [_land(cache, tmp_path, f"m{i}", 100_000) for i in range(4)]
    for age, expected in zip((400, 100, 300, 200), hashes, strict=True):
        _used(cache, expected, time.time() - age)
    assert trim(cache, limit=10**9) == []  # within the bound: nothing goes
    assert trim(cache, limit=250_000) == [hashes[0], hashes[2]]  # the two used longest ago
    assert cached(hashes[1], cache) and cached(hashes[3], cache)
    assert not cached(hashes[0], cache) and not (cache / ".locks" / hashes[0]).exists()
    assert trim(cache, limit=0) == [hashes[3], hashes[1]]
    assert sorted(p.name for p in cache.iterdir()) == [".locks"]


def test_an_entry_in_use_is_never_trimmed_and_a_use_counts_as_recent(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old, new = (_land(cache, tmp_path, name, 100_000) for name in ("old", "new"))
    _used(cache, old, time.time() - 1000)
    _used(cache, new, time.time() - 500)
    with hold(cache, old):  # a task starts using the old one: it is now the most recent
        assert trim(cache, limit=0) == [new]
    assert trim(cache, limit=0) == [old]


def test_another_process_holding_an_entry_keeps_it(tmp_path: Path) -> None:
    """flock between processes, as Ray's worker processes on one node use the cache."""
    cache = tmp_path / "cache"
    expected = _land(cache, tmp_path, "model", 50_000)
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom assay.runner.nodecache import hold\n"
        "with hold(Path(sys.argv[1]), sys.argv[2]):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(cache), expected],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert trim(cache, limit=0) == [] and cached(expected, cache)
    finally:
        holder.communicate("")
    assert holder.returncode == 0
    assert trim(cache, limit=0) == [expected] and not cached(expected, cache)


def test_a_hold_waiting_while_trim_removes_the_entry_locks_a_fresh_file(tmp_path: Path) -> None:
    """The race: a task asks for the lock while trim holds it to remove the entry. It must not end up
    holding the removed lock file (which would let the next trim take the entry it lands again)."""
    cache = tmp_path / "cache"
    expected = _land(cache, tmp_path, "model", 50_000)
    import fcntl

    lock = cache / ".locks" / expected
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as trim holds it while removing
    entered = threading.Event()

    def task() -> None:
        with hold(cache, expected):
            entered.set()
            time.sleep(0.3)

    thread = threading.Thread(target=task)
    thread.start()
    time.sleep(0.1)
    assert not entered.is_set()  # waiting for the exclusive lock
    lock.unlink()  # trim removes the entry's lock file, then lets go
    os.close(fd)
    assert entered.wait(5)
    assert trim(cache, limit=0) == []  # the task holds the new lock file: its entry stays
    thread.join()


def test_partial_unpacks_of_killed_processes_are_swept_once_stale(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    expected = _land(cache, tmp_path, "model", 1000)
    stale, fresh = cache / ".part-dead", cache / ".part-running"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "x").write_bytes(b"half")
    os.utime(stale, (time.time() - STALE_SECONDS - 10,) * 2)
    trim(cache, limit=10**9)
    assert not stale.exists() and fresh.exists() and cached(expected, cache)


def test_the_bound_comes_from_the_environment_and_a_bad_one_is_one_line(monkeypatch) -> None:
    monkeypatch.setenv(LIMIT_ENV, "1048576")
    assert cache_limit() == 2**20
    for bad in ("-1", "10GB", "1.5"):
        monkeypatch.setenv(LIMIT_ENV, bad)
        with pytest.raises(UserError, match=f"{LIMIT_ENV} must be .*value: '{bad}'"):
            cache_limit()
    monkeypatch.delenv(LIMIT_ENV)
    assert cache_limit() == 20 * 2**30
