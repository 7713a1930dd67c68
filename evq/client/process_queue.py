"""The messages of one queue between pull and acknowledgement, and the offset safe to commit.

Concurrent consumption finishes messages out of order, so the committed offset is the smallest
offset still in flight: a crash then redelivers the unfinished messages (and some finished ones
after them) rather than losing any.  Once nothing is in flight it is where the next pull
starts, so messages the broker's filter skipped are not pulled again.  The counts and sizes
feed the consumer's flow control.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from evq.domain.message import Message


class ProcessQueue:
    def __init__(self, start: int) -> None:
        self._msgs: dict[int, Message] = {}
        self._size = 0
        self._horizon = start
        self.dropped = False
        """Set when rebalance takes the queue away: in-flight results no longer commit."""

    @property
    def count(self) -> int:
        return len(self._msgs)

    @property
    def size(self) -> int:
        """Bytes of stored bodies in flight."""
        return self._size

    def put(self, msgs: Iterable[Message], next_offset: int) -> None:
        """Messages pulled, and the offset the next pull starts from."""
        for m in msgs:
            if m.queue_offset not in self._msgs:
                self._msgs[m.queue_offset] = m
                self._size += len(m.body)
        self._horizon = max(self._horizon, next_offset)

    def remove(self, msgs: Iterable[Message]) -> int:
        """Drop finished messages; the offset to commit now."""
        for m in msgs:
            if (gone := self._msgs.pop(m.queue_offset, None)) is not None:
                self._size -= len(gone.body)
        return self.commit_offset()

    def commit_offset(self) -> int:
        return min(self._msgs) if self._msgs else self._horizon
