"""``assay.fileio.atomic_path``: a failure leaves the target as it was and no folder made for it."""

from __future__ import annotations

import errno

import pytest

from assay.fileio import atomic_path


def test_a_failed_write_leaves_no_folder_and_no_temporary(tmp_path):
    target = tmp_path / "a" / "b" / "out.txt"
    with pytest.raises(OSError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_replaced_whole_or_left_as_it_was(tmp_path):
    target = tmp_path / "release"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(OSError), atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "new.txt").write_text("new")
        raise OSError(errno.EROFS, "Read-only file system")
    assert [p.name for p in tmp_path.iterdir()] == ["release"] and (target / "old.txt").read_text() == "old"
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"] and [p.name for p in tmp_path.iterdir()] == [
        "release"
    ]
