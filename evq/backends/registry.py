"""Backends by name: ``--backend=mmap`` on the command line, ``backend="mmap"`` in code."""

from __future__ import annotations

import os
from collections.abc import Callable

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


BACKENDS: dict[str, Opener] = {"mmap": _open_mmap}
DEFAULT_BACKEND = "mmap"


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
