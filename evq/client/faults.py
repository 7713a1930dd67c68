"""Latency fault tolerance for producers (seed 001): brokers that answered slowly or failed are
avoided for a while, so a dead broker costs one failed send rather than one per message until
the name servers notice.

Each send reports its latency (a failure counts as 30 s).  The latency falls into a band of
``LATENCY_MAX_MS``; the same band of ``NOT_AVAILABLE_MS`` says how long the broker is skipped::

    latency >=   50   100    550   1000   2000   3000  15000 ms
    skip for      0     0    30 s   60 s  120 s  180 s  600 s

Pure: the clock is injected and nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from evq.domain.clock import Clock
from evq.domain.queues import MessageQueue

LATENCY_MAX_MS: Final = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS: Final = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
FAILURE_LATENCY_MS: Final = 30_000
"""What a failed send counts as: the top band, so the broker is skipped for ten minutes."""


FIRST_SKIPPED_MS: Final = next(limit for limit, skip in zip(LATENCY_MAX_MS, NOT_AVAILABLE_MS,
                                                              strict=True) if skip)
"""The lowest latency that gets a broker skipped: below it (every healthy send) the band
search is not needed."""


def not_available_ms(latency_ms: int) -> int:
    """How long to skip a broker after a request that took ``latency_ms``."""
    if latency_ms < FIRST_SKIPPED_MS:
        return 0
    for limit, duration in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_MS),
                               strict=True):
        if latency_ms >= limit:
            return duration
    return 0


@attrs.define(slots=True)
class FaultItem:
    broker: str
    latency_ms: int
    available_at_ms: int
    """When the broker may be tried again: the report's time plus its band's skip, or 0 after a
    healthy report (below the first skipped band), which skips the broker for no time and so
    needs no clock read to record."""


class LatencyFaultTolerance:
    """The per-broker table; a broker never reported is available.

    A :class:`~evq.client.blocking.SyncProducer` reports its direct sends from its callers'
    threads while its loop's thread reports the rest, so an update writes a broker's item
    before it puts the broker in the skipped set: a reader on another thread never finds a
    skipped broker without its item.  Two reports racing leave one of them, as RocketMQ's
    table does."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._items: dict[str, FaultItem] = {}
        self.skipping: set[str] = set()
        """Brokers whose last report skipped them (read it, never write it): only these need
        the clock to tell whether they are available, so a send to a healthy broker reads it
        neither when it picks the queue (:func:`select_queue`) nor when it reports."""

    def update(self, broker: str, latency_ms: int, *, failed: bool = False) -> None:
        item = self._items.get(broker)
        skipped = failed or latency_ms >= FIRST_SKIPPED_MS
        if skipped:
            latency = FAILURE_LATENCY_MS if failed else latency_ms
            until = self._clock.now_ms() + not_available_ms(latency)
        elif item is not None and broker not in self.skipping:
            item.latency_ms = latency_ms  # every healthy send to a healthy broker: all it takes
            return
        else:  # healthy again, or for the first time: no band to look up, no skip to time
            latency, until = latency_ms, 0
        if item is None:
            self._items[broker] = FaultItem(broker, latency, until)
        else:  # every send reports: the broker's item is updated in place, not rebuilt
            item.latency_ms, item.available_at_ms = latency, until
        if skipped:  # after the item (see the class)
            self.skipping.add(broker)
        else:
            self.skipping.discard(broker)

    def is_available(self, broker: str) -> bool:
        return (broker not in self.skipping
                or self._clock.now_ms() >= self._items[broker].available_at_ms)

    def least_bad(self) -> str | None:
        """The broker that becomes available first (lowest latency on ties), when every
        broker is being skipped and one must be tried anyway."""
        if not self._items:
            return None
        return min(self._items.values(), key=lambda i: (i.available_at_ms, i.latency_ms)).broker


def select_queue(
    queues: Sequence[MessageQueue],
    start: int,
    faults: LatencyFaultTolerance,
    last_failed: str | None = None,
) -> MessageQueue:
    """Round-robin from ``start``: the first queue on an available broker other than the one
    that just failed; else the least bad broker's next queue; else any other broker's; else
    the queue at ``start`` (a single-broker cluster has nowhere else to go).

    The common case, the first choice on a broker the fault table is not skipping, is
    decided by a set lookup: a producer asks on every send."""
    n = len(queues)
    if not n:
        raise ValueError("no queue to select from")
    first = queues[start % n]
    broker = first.broker_name
    if broker != last_failed and (broker not in faults.skipping
                                  or faults.is_available(broker)):
        return first  # decided without building the ring
    ring = [queues[(start + i) % n] for i in range(n)]
    for q in ring:
        if q.broker_name != last_failed and faults.is_available(q.broker_name):
            return q
    least = faults.least_bad()
    for q in ring:
        if q.broker_name == least and q.broker_name != last_failed:
            return q
    for q in ring:
        if q.broker_name != last_failed:
            return q
    return ring[0]
