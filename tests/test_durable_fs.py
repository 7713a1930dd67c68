"""evq.durable_fs on real files.  What it syncs, and when, is checked from a trace of the
stores using it (tests/backends/test_power_loss.py); here, what it leaves on disk and how its
deferred syncs treat files that changed meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evq import durable_fs


def test_make_dirs_creates_the_missing_directories_and_accepts_existing_ones(
    tmp_path: Path,
) -> None:
    deep = tmp_path / "a" / "b" / "c"
    durable_fs.make_dirs(deep)
    assert deep.is_dir()
    durable_fs.make_dirs(deep)
    pending = durable_fs.PendingSyncs()
    durable_fs.make_dirs(tmp_path / "a" / "d", pending)
    pending.sync()
    assert (tmp_path / "a" / "d").is_dir()


def test_make_dirs_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(OSError):
        durable_fs.make_dirs(tmp_path / "f" / "d")


def test_open_sized_creates_or_resizes_and_never_truncates_a_same_size_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "seg"
    with pytest.raises(FileNotFoundError):
        durable_fs.open_sized(path, 4096, create=False)
    fd = durable_fs.open_sized(path, 4096, create=True)
    os.pwrite(fd, b"kept", 100)
    os.close(fd)
    fd = durable_fs.open_sized(path, 4096, create=True)  # exists: opened as it is
    assert os.pread(fd, 4, 100) == b"kept" and os.fstat(fd).st_size == 4096
    os.close(fd)
    pending = durable_fs.PendingSyncs()
    fd = durable_fs.open_sized(path, 8192, create=False, pending=pending)
    assert os.fstat(fd).st_size == 8192
    os.close(fd)
    pending.sync()


def test_a_deferred_sync_skips_what_was_deleted_meanwhile(tmp_path: Path) -> None:
    """A ConsumeQueue file may be truncated away before the projection flush syncs it."""
    pending = durable_fs.PendingSyncs()
    os.close(durable_fs.open_sized(tmp_path / "gone", 64, create=True, pending=pending))
    (tmp_path / "gone").unlink()
    pending.sync()


def test_a_failed_deferred_sync_stays_pending(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    pending = durable_fs.PendingSyncs()
    pending.add([tmp_path, tmp_path / "file" / "not-a-dir"])
    with pytest.raises(NotADirectoryError):
        pending.sync()
    with pytest.raises(NotADirectoryError):  # still there for the next flush to retry
        pending.sync()
    (tmp_path / "file").unlink()
    pending.sync()  # gone now: nothing left to keep
    pending.sync()


def test_touch_creates_a_marker_once_and_keeps_an_existing_one(tmp_path: Path) -> None:
    marker = tmp_path / "abort"
    durable_fs.touch(marker)
    marker.write_bytes(b"x")
    durable_fs.touch(marker)
    assert marker.read_bytes() == b"x"
