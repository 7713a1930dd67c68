"""Disk space: when a store refuses puts, and how it knows a write found no space.

RocketMQ's watermarks, on the share of the store's file system in use (``used / total``, as
Java's ``getTotalSpace`` and ``getFreeSpace`` give it, and as ``commitLogDiskRatio``
reports it)::

    0 ...... diskMaxUsedSpaceRatio 75% ...... CleanForcibly 0.85 ...... WarningLevel 0.90 ...... 1
             expired files go early            the oldest go too        puts are refused

The first two are the cleaner's (:func:`evq.backends.rules.clean_due`); the last is
:func:`ratio_refusal`.  A store also refuses puts once an allocation found no space at all,
whatever the ratio says (a file system smaller than a segment, another process filling it
between samples): :func:`no_space` recognises that failure.  Pure functions; the store shell
(:mod:`evq.backends.shell`) samples the disk and holds the state.
"""

from __future__ import annotations

import errno
from pathlib import Path

from evq.backends.config import StoreConfig

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
    return (f"disk full: no space for {need} bytes at {path} ({error}); puts are refused until "
            f"space is freed")


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
