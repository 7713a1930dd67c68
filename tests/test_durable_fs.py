"""evq.durable_fs on real files.  What it syncs, and when, is checked from a trace of the
stores using it (tests/backends/test_power_loss.py); here, what it leaves on disk and how its
deferred syncs treat files that changed meanwhile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evq import durable_fs
from tests.backends.test_power_loss import _strace
from tests.processes import REPO_ROOT, python_env


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


def test_replace_durably_leaves_the_new_content_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "offsets.json"
    durable_fs.replace_durably(path, b"old")
    durable_fs.replace_durably(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["offsets.json"]


def test_replace_durably_syncs_the_new_file_before_the_rename_and_the_directory_after(
        tmp_path: Path) -> None:
    """The order that makes a power cut leave the old content or the new: data synced, then
    renamed over the old file, then the rename itself synced (the directory)."""
    strace = _strace()
    path = tmp_path / "offsets.json"
    program = ("from pathlib import Path; from evq.durable_fs import replace_durably; "
               f"replace_durably(Path({str(path)!r}), b'x' * 10)")
    out = subprocess.run([strace, "-f", "-qq", "-y", "-e", "trace=openat,fsync,rename",
                          sys.executable, "-c", program], capture_output=True, text=True,
                         cwd=REPO_ROOT, env=python_env(), timeout=60, check=True)
    calls = [line for line in out.stderr.splitlines() if str(tmp_path) in line]
    synced_tmp = next(i for i, line in enumerate(calls)
                      if line.startswith("fsync") and "offsets.json.tmp" in line)
    renamed = next(i for i, line in enumerate(calls) if line.startswith("rename"))
    synced_dir = max(i for i, line in enumerate(calls)
                     if line.startswith("fsync") and line.rstrip().endswith(f"<{tmp_path}>)"
                                                                           " = 0"))
    assert synced_tmp < renamed < synced_dir, calls
