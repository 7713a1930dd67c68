"""ProcessQueue's commit offset as a stateful model: never past an unfinished message."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from evq.client.process_queue import ProcessQueue
from evq.domain.message import Message


def msg(offset: int, size: int = 3) -> Message:
    return Message(topic="T", body=b"x" * size, queue_offset=offset)


class ProcessQueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pq = ProcessQueue(0)
        self.next = 0
        self.newest = 0
        self.in_flight: set[int] = set()

    @rule(n=st.integers(0, 5), skipped=st.integers(0, 3))
    def pull(self, n: int, skipped: int) -> None:
        """``n`` messages, then ``skipped`` offsets the broker's filter passed over."""
        self.pq.put([msg(o) for o in range(self.next, self.next + n)], self.next + n + skipped)
        self.in_flight |= set(range(self.next, self.next + n))
        self.newest = self.next + n - 1 if n else self.newest
        self.next += n + skipped

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        if not self.in_flight:
            return
        done = data.draw(st.sets(st.sampled_from(sorted(self.in_flight)), min_size=1))
        self.in_flight -= done
        committed = self.pq.remove([msg(o) for o in done])
        assert committed == (min(self.in_flight) if self.in_flight else self.next)

    @invariant()
    def counts(self) -> None:
        assert self.pq.count == len(self.in_flight)
        assert self.pq.size == 3 * len(self.in_flight)
        assert self.pq.commit_offset() == (min(self.in_flight) if self.in_flight else self.next)
        assert self.pq.span == (self.newest - min(self.in_flight) if self.in_flight else 0)


TestProcessQueue = ProcessQueueModel.TestCase


class OrderlyModel(RuleBasedStateMachine):
    """Orderly use: messages leave strictly in offset order, a put-back message comes first
    again, and the commit offset never passes a message not yet committed."""

    def __init__(self) -> None:
        super().__init__()
        self.pq = ProcessQueue(0)
        self.next = 0
        self.waiting: list[int] = []
        self.taken: list[int] = []

    @rule(n=st.integers(0, 5), skipped=st.integers(0, 3))
    def pull(self, n: int, skipped: int) -> None:
        self.pq.put([msg(o) for o in range(self.next, self.next + n)], self.next + n + skipped)
        self.waiting += range(self.next, self.next + n)
        self.next += n + skipped

    @rule(n=st.integers(1, 3))
    def take(self, n: int) -> None:
        got = [m.queue_offset for m in self.pq.take(n)]
        assert got == self.waiting[:n]
        self.waiting, self.taken = self.waiting[n:], self.taken + got

    @rule()
    def commit(self) -> None:
        self.taken = []
        assert self.pq.commit() == (self.waiting[0] if self.waiting else self.next)

    @rule()
    def put_back(self) -> None:
        self.pq.put_back()
        self.waiting, self.taken = sorted(self.taken + self.waiting), []

    @invariant()
    def counts(self) -> None:
        held = self.waiting + self.taken
        assert self.pq.count == len(held)
        assert self.pq.size == 3 * len(held)
        assert self.pq.commit_offset() == (min(held) if held else self.next)


TestOrderlyProcessQueue = OrderlyModel.TestCase


def test_a_restarted_queue_is_empty_but_keeps_its_lock() -> None:
    pq = ProcessQueue(0)
    pq.put([msg(0), msg(1)], 2)
    pq.locked, pq.locked_at = True, 12.5
    fresh = pq.restarted(7)
    assert (fresh.count, fresh.commit_offset(), fresh.locked, fresh.locked_at) == (0, 7, True, 12.5)
    assert not fresh.lock_expired(12.5 + 30) and fresh.lock_expired(12.5 + 30.1)


def test_a_redelivered_message_is_counted_once() -> None:
    pq = ProcessQueue(5)
    pq.put([msg(5), msg(5)], 6)
    assert (pq.count, pq.size) == (1, 3)
    assert pq.remove([msg(5)]) == 6
