"""The messages of one queue between pull and acknowledgement, and the offset safe to commit.

Concurrent consumption finishes messages out of order, so the committed offset is the smallest
offset still in flight: a crash then redelivers the unfinished messages (and some finished ones
after them) rather than losing any.  Once nothing is in flight it is where the next pull
starts, so messages the broker's filter skipped are not pulled again.  The count, size and
offset span feed the consumer's flow control.

Orderly consumption hands messages out strictly in offset order with :meth:`take`; they stay
counted until :meth:`commit` (done) or :meth:`put_back` (to be consumed again, first).  The
queue also carries the state of its broker lock, which orderly consumption checks before each
message.  Pure: no I/O; time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sortedcontainers import SortedDict

from evq.domain.message import Message

LOCK_MAX_LIVE_S: Final = 30.0
"""A lock not renewed for this long is treated as lost here, well before the broker frees it
(60 s): a member cut off from the broker stops consuming before another may start."""


class ProcessQueue:
    def __init__(self, start: int) -> None:
        self._msgs: SortedDict = SortedDict()  # queue offset -> Message, not being consumed
        self._taken: SortedDict = SortedDict()  # handed out by take(), awaiting commit
        self._size = 0
        self._horizon = start
        self._newest = start
        self.dropped = False
        """Set when rebalance takes the queue away or its offset is reset: in-flight results
        no longer commit."""
        self.locked = False
        self.locked_at = 0.0
        """Monotonic seconds of the last successful LOCK_BATCH_MQ that included this queue."""

    @property
    def count(self) -> int:
        return len(self._msgs) + len(self._taken)

    @property
    def size(self) -> int:
        """Bytes of stored bodies held."""
        return self._size

    @property
    def span(self) -> int:
        """Newest message pulled minus oldest still held: how many offsets a restart would
        consume again (the committed offset cannot pass the oldest).  Java's getMaxSpan
        measures only the messages still cached, so one stuck message lets its queue run on
        batch by batch; this does not."""
        firsts = [d.peekitem(0)[0] for d in (self._msgs, self._taken) if d]
        return self._newest - min(firsts) if firsts else 0

    def put(self, msgs: Iterable[Message], next_offset: int) -> None:
        """Messages pulled, and the offset the next pull starts from."""
        for m in msgs:
            if m.queue_offset not in self._msgs and m.queue_offset not in self._taken:
                self._msgs[m.queue_offset] = m
                self._size += len(m.body)
                self._newest = max(self._newest, m.queue_offset)
        self._horizon = max(self._horizon, next_offset)

    def remove(self, msgs: Iterable[Message]) -> int:
        """Drop finished messages; the offset to commit now."""
        for m in msgs:
            if (gone := self._msgs.pop(m.queue_offset, None)) is not None:
                self._size -= len(gone.body)
        return self.commit_offset()

    def commit_offset(self) -> int:
        firsts = [d.peekitem(0)[0] for d in (self._msgs, self._taken) if d]
        return min(firsts) if firsts else self._horizon

    def restarted(self, start: int) -> ProcessQueue:
        """An empty queue from ``start`` that keeps this one's lock: an offset reset moves the
        position, not the ownership."""
        pq = ProcessQueue(start)
        pq.locked, pq.locked_at = self.locked, self.locked_at
        return pq

    # -- orderly ----------------------------------------------------------------------------

    def take(self, n: int) -> list[Message]:
        """The ``n`` lowest-offset messages not yet handed out, in order."""
        out = []
        while self._msgs and len(out) < n:
            offset, m = self._msgs.popitem(0)
            self._taken[offset] = m
            out.append(m)
        return out

    def commit(self) -> int:
        """The taken messages are done; the offset to commit now."""
        for m in self._taken.values():
            self._size -= len(m.body)
        self._taken.clear()
        return self.commit_offset()

    def put_back(self) -> None:
        """The taken messages are to be consumed again, before anything after them."""
        self._msgs.update(self._taken)
        self._taken.clear()

    def lock_expired(self, now: float) -> bool:
        return now - self.locked_at > LOCK_MAX_LIVE_S
