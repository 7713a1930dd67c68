"""Backends by name: ``--backend=mmap`` on the command line, ``backend="mmap"`` in code.

``mmap`` is RocketMQ's CommitLog design (the default); ``lmdb`` and ``rocks`` run the same port
on LMDB and RocksDB; ``memory`` is the in-memory reference (the executable specification,
nothing survives the process).  :data:`TRAITS` says what a backend can and cannot promise, so
the conformance suite skips a case with a reason instead of leaving a backend out.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

import attrs

from evq.backends.config import StoreConfig
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.log import MessageLog
from evq.domain.record import TagsCodeFn, default_tags_code

Opener = Callable[..., MessageLog]


def _open_mmap(
    path: str | os.PathLike[str], config: StoreConfig, *, clock: Clock, tags_code_fn: TagsCodeFn,
    background: bool,
) -> MessageLog:
    from evq.backends.mmapfile import MmapMessageLog

    return MmapMessageLog.open(path, config, clock=clock, tags_code_fn=tags_code_fn,
                               background=background)


def _keyed(module: str, driver: str) -> Opener:
    """An opener of the key-value log on ``module.driver``, imported on first use (a driver
    library loads only when its backend is chosen)."""

    def open_keyed(
        path: str | os.PathLike[str], config: StoreConfig, *, clock: Clock,
        tags_code_fn: TagsCodeFn, background: bool,
    ) -> MessageLog:
        from evq.backends.kvlog.store import KeyedMessageLog

        return KeyedMessageLog.open(
            path, config, driver=getattr(importlib.import_module(module), driver), clock=clock,
            tags_code_fn=tags_code_fn, background=background,
        )

    return open_keyed


BACKENDS: dict[str, Opener] = {
    "mmap": _open_mmap,
    "lmdb": _keyed("evq.backends.lmdb", "LmdbDriver"),
    "rocks": _keyed("evq.backends.rocks", "RocksDriver"),
    "memory": _keyed("evq.backends.memory", "MemoryDriver"),
}
DEFAULT_BACKEND = "mmap"


@attrs.frozen(slots=True)
class BackendTraits:
    persistent: bool
    """The store outlives the process (SIGKILL, power loss once synced)."""
    file_tail: bool
    """The log ends in files written in place, which a crash or a disk can leave torn or
    damaged, and recovery must cut (mmap).  LMDB (copy-on-write commits) and RocksDB (its
    checksummed write-ahead log) never expose half a write, so they have no such tail."""


TRAITS: dict[str, BackendTraits] = {
    "mmap": BackendTraits(persistent=True, file_tail=True),
    "lmdb": BackendTraits(persistent=True, file_tail=False),
    "rocks": BackendTraits(persistent=True, file_tail=False),
    "memory": BackendTraits(persistent=False, file_tail=False),
}


class UnknownBackend(ValueError):
    pass


def open_log(
    backend: str,
    path: str | os.PathLike[str],
    config: StoreConfig | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    tags_code_fn: TagsCodeFn = default_tags_code,
    background: bool = True,
) -> MessageLog:
    """Open (and recover) the store at ``path`` with the named backend."""
    try:
        opener = BACKENDS[backend]
    except KeyError:
        choices = ", ".join(sorted(BACKENDS))
        raise UnknownBackend(f"unknown backend {backend!r}; choose one of: {choices}") from None
    return opener(path, config or StoreConfig(), clock=clock, tags_code_fn=tags_code_fn,
                  background=background)
