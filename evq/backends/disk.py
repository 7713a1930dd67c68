"""Disk space: when a store refuses puts, how it knows a write found no space, and blocks
allocated before a mapping is written.

RocketMQ's watermarks, on the share of the store's file system in use (``used / total``, as
Java's ``getTotalSpace`` and ``getFreeSpace`` give it, and as ``commitLogDiskRatio``
reports it)::

    0 ...... diskMaxUsedSpaceRatio 75% ...... CleanForcibly 0.85 ...... WarningLevel 0.90 ...... 1
             expired files go early            the oldest go too        puts are refused

The first two are the cleaner's (:func:`evq.backends.rules.clean_due`); the last is
:func:`ratio_refusal`.  A store also refuses puts once an allocation found no space at all,
whatever the ratio says (a file system smaller than a segment, another process filling it
between samples): :func:`no_space` recognises that failure.  The store shell
(:mod:`evq.backends.shell`) samples the disk and holds the state.

Writes through a shared mapping must never be what finds the disk full: a store writing a
page whose block the file system has yet to allocate takes a fault, and on a full file system
that fault is SIGBUS, which kills the process with every in-flight send unanswered (and again
at every restart that writes).  So every file a store maps for writing has its blocks
allocated for real first (:func:`allocate_blocks`), where a full disk is an ``OSError``
(ENOSPC) the store turns into refused puts.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from evq.backends.config import StoreConfig
from evq.domain.log import LogError

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
WRITE_SLACK = 1024 * 1024
"""Free space below which a failed write is taken for a full disk even when its error does
not say so (see :func:`failed_for_space`), on top of twice the write's own size."""


def ratio_refusal(config: StoreConfig, used_ratio: float, path: Path) -> str:
    """Why puts are refused at ``used_ratio`` of the disk holding ``path``; empty if they are
    not (RocketMQ marks the disk full strictly above the warning level)."""
    limit = config.disk_space_warning_level_ratio
    if used_ratio <= limit:
        return ""
    return (f"disk full: {path} is {used_ratio:.1%} used, above the warning level of "
            f"{limit:.0%}; puts are refused until space is freed")


def space_refusal(path: Path, need: int, error: BaseException) -> str:
    """Why puts are refused after an allocation of ``need`` bytes at ``path`` failed."""
    why = getattr(error, "strerror", None) or str(error)
    return (f"disk full: no space for {need} more bytes at {path} ({why}); puts are refused "
            f"until space is freed")


def failed_for_space(error: BaseException, need: int, free: int) -> bool:
    """Whether a write of ``need`` bytes that failed with ``error``, on a disk with ``free``
    bytes left, failed for want of space.  Not every library says so: LMDB reports a short
    write as EIO.  A write with less than twice its size (and some slack for pages and
    metadata) left on the disk is taken for one that ran out of space."""
    return no_space(error) or free < 2 * need + WRITE_SLACK


def no_space(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says the file system is full."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in NO_SPACE_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class AllocationUnsupported(LogError):
    """The file system cannot allocate a file's blocks ahead of its writes."""


class NoSpace(OSError):
    """ENOSPC from :func:`allocate_blocks`: ``need`` more bytes were wanted at ``filename``."""

    need: int = 0


def allocate_blocks(fd: int, offset: int, length: int, path: Path) -> None:
    """Allocate the blocks of ``[offset, offset + length)`` of the file open as ``fd``.

    ``posix_fallocate`` reserves them without writing (glibc writes a byte a block where the
    file system lacks ``fallocate``), so a later write through a mapping needs no space.
    Raises :class:`NoSpace` naming ``path`` when the disk has no room, and
    :class:`AllocationUnsupported` when the file system can do neither.

    The free space is checked first: some file systems (ext4) keep what a failed
    ``fallocate`` got before it ran out, which would leave the disk fuller than before.  The
    blocks the file already has count as allocated from its start, as a store's files are
    (a prefix is allocated, then written).
    """
    if length <= 0:
        return
    missing = offset + length - os.fstat(fd).st_blocks * 512
    vfs = os.fstatvfs(fd)
    try:
        if missing > vfs.f_bavail * vfs.f_frsize:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            full = NoSpace(exc.errno, f"{exc.strerror} (allocating {length} bytes)", str(path))
            full.need = max(missing, 0)
            raise full from exc
        raise AllocationUnsupported(
            f"cannot allocate the blocks of {path} ({exc.strerror}): evq writes its store "
            f"through mappings and needs their blocks allocated first (posix_fallocate), so "
            f"that a full disk is refused puts rather than SIGBUS"
        ) from exc
