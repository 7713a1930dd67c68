"""Broker-side queue locks for orderly consumption (RocketMQ's RebalanceLockManager).

Rebalance runs independently in every consumer, so for a moment after a membership change two
members may both believe a queue is theirs.  Concurrent consumers shrug that off as a duplicate;
orderly consumers must not, so before pulling a queue they lock it on its broker master
(LOCK_BATCH_MQ), re-lock what they hold every 20 s and unlock what they give up.  A lock not
refreshed for 60 s is free for the next member to take: that is how the queues of a consumer
that died without unlocking get consumed again.

Expiry is measured on the clock's monotonic time: a wall-clock step must neither free every
lock at once (two members consuming one ordered queue) nor keep a dead member's locks alive.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import attrs

from evq import logs
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.queues import MessageQueue

log = logs.get_logger(__name__)

LOCK_MAX_LIVE_S = 60.0
"""``rocketmq.broker.rebalance.lockMaxLiveTime``: a lock not refreshed for longer is free."""


@attrs.define(slots=True)
class _Lock:
    owner: str
    refreshed_at: float


class RebalanceLockManager:
    """Per consumer group, which client holds each queue.  One mutex serialises every call:
    a batch is granted or refused as a whole against one consistent table."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, max_live_s: float = LOCK_MAX_LIVE_S):
        self._clock = clock
        self._max_live_s = max_live_s
        self._mutex = threading.Lock()
        self._groups: dict[str, dict[MessageQueue, _Lock]] = {}

    def _expired(self, lock: _Lock, now: float) -> bool:
        return now - lock.refreshed_at > self._max_live_s

    def lock_batch(
        self, group: str, queues: Iterable[MessageQueue], client_id: str
    ) -> set[MessageQueue]:
        """Lock ``queues`` for ``client_id`` where possible; returns the queues it now holds.

        A queue is granted when nobody holds it, when its lock has expired, or when
        ``client_id`` holds it already; each granted lock is refreshed.  A queue held by a
        live other client is refused.
        """
        granted: set[MessageQueue] = set()
        taken_over: dict[MessageQueue, str] = {}
        refused: dict[MessageQueue, str] = {}
        with self._mutex:
            now = self._clock.monotonic()
            table = self._groups.setdefault(group, {})
            for q in queues:
                lock = table.get(q)
                if lock is None or lock.owner == client_id or self._expired(lock, now):
                    if lock is not None and lock.owner != client_id:
                        taken_over[q] = lock.owner
                    table[q] = _Lock(client_id, now)
                    granted.add(q)
                else:
                    refused[q] = lock.owner
            if not table:
                del self._groups[group]
        if taken_over:
            log.warning(
                "queue_lock_expired_taken_over", group=group, client_id=client_id,
                previous_owners=taken_over,
            )
        if refused:
            log.info("queue_lock_refused", group=group, client_id=client_id, held_by=refused)
        return granted

    def unlock_batch(
        self, group: str, queues: Iterable[MessageQueue], client_id: str
    ) -> set[MessageQueue]:
        """Release the locks ``client_id`` holds among ``queues``; returns those released.

        Locks of other clients are left alone.  An expired lock of ``client_id`` is released
        too: nobody else has taken it, so it is still the caller's to give up.
        """
        released: set[MessageQueue] = set()
        with self._mutex:
            table = self._groups.get(group)
            if table is None:
                return released
            for q in queues:
                lock = table.get(q)
                if lock is not None and lock.owner == client_id:
                    del table[q]
                    released.add(q)
            if not table:
                del self._groups[group]
        return released

    def is_locked(self, group: str, queue: MessageQueue, client_id: str) -> bool:
        """Whether ``client_id`` holds a live lock on ``queue``.  Only a query: unlike Java's
        private ``isLocked`` it does not refresh the lock."""
        with self._mutex:
            lock = self._groups.get(group, {}).get(queue)
            return (
                lock is not None
                and lock.owner == client_id
                and not self._expired(lock, self._clock.monotonic())
            )
