"""Files and directories created so that they survive a power cut, not only a crash.

A file written and then msync'd or fsync'd can still vanish in a power cut: its blocks reach
the disk, but nothing points at them if the directory entry naming the file was never
written back.  The kernel writes a new entry back on its own schedule (ext4 with its next
journal commit, seconds later), and a SIGKILL never shows the gap because the page cache
outlives the process.  The same holds for a new directory's entry in its parent, and for a
size set by ``ftruncate``: inode metadata, which msync need not write (POSIX promises the
mapped data only).

So everything here makes what it creates durable once, at creation: the new file is fsync'd
(its size), then the directory holding its entry, and for each directory it had to create,
that directory's parent.  The cost is a few syncs per new file, never one per write.  A
creator that must not wait for the disk where it creates (a ConsumeQueue file is created
under the store's put lock) passes a :class:`PendingSyncs` instead, and whoever later claims
the file durable (the projection flush, before it writes the checkpoint) calls its
:meth:`~PendingSyncs.sync` first.

Every store's creator goes through here (the mmap backend's segments, ConsumeQueues, index
files, checkpoint and abort marker; the key-value backends' directories and abort marker; the
SQL metadata store's directory), so there is one place that knows the rule.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable
from pathlib import Path


def sync_path(path: Path) -> None:
    """fsync a file or directory by name (any descriptor of an inode writes it back)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PendingSyncs:
    """Paths created without waiting for the disk, to be made durable by one later call.

    Thread-safe: creators add under their own locks, the flusher syncs from its thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[Path, None] = {}  # insertion-ordered set

    def add(self, paths: Iterable[Path]) -> None:
        with self._lock:
            self._paths.update(dict.fromkeys(paths))

    def sync(self) -> None:
        """fsync every path added so far.  A path deleted meanwhile has nothing left to keep;
        on any other error the paths not yet synced stay pending for the next call."""
        with self._lock:
            paths, self._paths = list(self._paths), {}
        for i, path in enumerate(paths):
            try:
                sync_path(path)
            except FileNotFoundError:
                continue
            except BaseException:
                self.add(paths[i:])
                raise


def _settle(paths: Iterable[Path], pending: PendingSyncs | None) -> None:
    if pending is not None:
        pending.add(paths)
        return
    for path in paths:
        sync_path(path)


def make_dirs(path: Path, pending: PendingSyncs | None = None) -> None:
    """``mkdir -p path``, leaving each directory it created durable in its parent.

    A directory another thread created meanwhile is synced all the same: that thread may not
    have synced it yet when this one goes on to put a file in it."""
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        if p.exists():  # a file where a directory must go: say so, as mkdir -p does
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(p))
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if not d.is_dir():
                raise
    _settle([d.parent for d in reversed(missing)], pending)


def open_sized(path: Path, size: int, *, create: bool, pending: PendingSyncs | None = None
               ) -> int:
    """A read-write descriptor of ``path`` holding exactly ``size`` bytes (sparse).

    With ``create`` a missing file is created.  A new file and a changed size are made
    durable: the file (its size), then its directory (a new entry)."""
    created = False
    if create:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            created = True
        except FileExistsError:
            fd = os.open(path, os.O_RDWR)
    else:
        fd = os.open(path, os.O_RDWR)
    try:
        resized = os.fstat(fd).st_size != size
        if resized:
            os.ftruncate(fd, size)
        if resized or created:
            if pending is None:
                os.fsync(fd)
            else:
                pending.add([path])
        if created:
            _settle([path.parent], pending)
    except BaseException:
        os.close(fd)
        raise
    return fd


def touch(path: Path) -> None:
    """Make sure an empty marker file exists at ``path``, durably.

    Its directory is synced even when the file was already there: a marker left by an earlier
    run that was killed may never have reached the disk."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    sync_path(path.parent)


def replace_durably(path: Path, data: bytes) -> None:
    """Make ``data`` the whole content of ``path``: after a crash or a power cut the file holds
    the old content or the new, never a mix and never nothing.  The new content goes to a
    temporary file beside it, which is fsync'd, renamed over ``path``, and the directory
    fsync'd for the rename; blocking, so callers on an event loop run it in a thread."""
    make_dirs(path.parent)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        rename_into_place(fd, tmp, path)
    finally:
        os.close(fd)


def rename_into_place(fd: int, src: Path, dst: Path) -> None:
    """Give the file at ``src``, open as ``fd``, the name ``dst`` (in the same directory,
    replacing any file there), durably: the file is fsync'd (its content, its size), renamed,
    and the directory fsync'd for the new entry.  After a power cut ``dst`` is the old file or
    the whole new one.  The entry under ``src`` need never have been synced: until the
    rename the file is nothing its owner would miss after a power cut."""
    os.fsync(fd)
    os.replace(src, dst)
    sync_path(dst.parent)
