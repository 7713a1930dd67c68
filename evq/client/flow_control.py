"""When a push consumer stops pulling a queue for a moment: its listener is behind.

Pulling on regardless would fill memory with messages the listener cannot take yet, so before
each pull the queue's :class:`~evq.client.process_queue.ProcessQueue` is held against three
limits (the Java client's, by its names): cached messages (``pullThresholdForQueue``), cached
bytes (``pullThresholdSizeForQueue``) and, for concurrent consumption, the offset span
between the oldest message in flight and the newest pulled (``consumeConcurrentlyMaxSpan``:
one stuck message must not let the rest of the queue run thousands of offsets ahead, since
the committed offset cannot pass it).  A pull held back waits 50 ms and checks again.  Logging
every hold would flood the log, so :class:`Holds` says which ones to log.  Pure.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from evq.client.process_queue import ProcessQueue

HOLD_S: Final = 0.05
LOG_EVERY: Final = 1000
"""Log the first hold of a queue and every 1000th after it (as the Java client does)."""


class Exceeded(enum.Enum):
    COUNT = "cached message count"
    SIZE = "cached message size"
    SPAN = "cached offset span"


@attrs.frozen(slots=True, kw_only=True)
class FlowLimits:
    max_count: int = 1000
    max_bytes: int = 100 * 1024 * 1024
    max_span: int = 2000

    def exceeded(self, pq: ProcessQueue, *, orderly: bool) -> Exceeded | None:
        """The limit ``pq`` is over, if any; orderly queues have no span limit (they consume
        in order, so the span is just the cached count)."""
        if pq.count > self.max_count:
            return Exceeded.COUNT
        if pq.size > self.max_bytes:
            return Exceeded.SIZE
        if not orderly and pq.span > self.max_span:
            return Exceeded.SPAN
        return None


@attrs.define(slots=True)
class Holds:
    """How many pulls a consumer held back; :meth:`hit` is True for the ones worth a log
    line."""

    count: int = 0

    def hit(self) -> bool:
        self.count += 1
        return (self.count - 1) % LOG_EVERY == 0
