"""The in-memory reference backend: the MessageLog port's executable specification.

It runs the key-value log (:mod:`evq.backends.kvlog.store`) over plain sorted in-memory
tables (:mod:`evq.backends.memory.tables`), with the same offsets, statuses and projections as
every other backend, and no durability beyond the process: a store reopened in the same
process finds its data, a crashed process loses it all.
"""

from __future__ import annotations

import os

from evq.backends.config import StoreConfig
from evq.backends.kvlog.store import KeyedMessageLog
from evq.backends.memory.tables import MemoryDriver
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.record import TagsCodeFn, default_tags_code


def open_memory_log(
    path: str | os.PathLike[str],
    config: StoreConfig | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    tags_code_fn: TagsCodeFn = default_tags_code,
    background: bool = True,
) -> KeyedMessageLog:
    return KeyedMessageLog.open(path, config, driver=MemoryDriver, clock=clock,
                                tags_code_fn=tags_code_fn, background=background)


__all__ = ["open_memory_log"]
