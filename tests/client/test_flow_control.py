"""Flow-control limits and the rate of their log lines (pure)."""

from __future__ import annotations

import pytest

from evq.client.flow_control import LOG_EVERY, Exceeded, FlowLimits, Holds
from evq.client.process_queue import ProcessQueue
from evq.domain.message import Message

LIMITS = FlowLimits(max_count=3, max_bytes=100, max_span=10)


def holding(*offsets: int, size: int = 1) -> ProcessQueue:
    pq = ProcessQueue(0)
    pq.put([Message(topic="T", body=b"x" * size, queue_offset=o) for o in offsets], 0)
    return pq


@pytest.mark.parametrize(("pq", "orderly", "expected"), [
    (holding(0, 1, 2), False, None),
    (holding(0, 1, 2, 3), False, Exceeded.COUNT),
    (holding(0, 1, size=51), False, Exceeded.SIZE),
    (holding(0, 11), False, Exceeded.SPAN),
    (holding(0, 11), True, None),  # orderly queues have no span limit
    (holding(0, 10), False, None),
])
def test_the_first_limit_exceeded_is_named(pq: ProcessQueue, orderly: bool,
                                           expected: Exceeded | None) -> None:
    assert LIMITS.exceeded(pq, orderly=orderly) is expected


def test_holds_log_the_first_and_then_every_thousandth() -> None:
    holds = Holds()
    logged = [n for n in range(1, 2 * LOG_EVERY + 2) if holds.hit()]
    assert logged == [1, LOG_EVERY + 1, 2 * LOG_EVERY + 1]
