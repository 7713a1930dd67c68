"""Orderly push consumption: one queue's messages to the listener strictly one after another.

Order holds only if one member at a time consumes a queue, and rebalance alone cannot promise
that (members rebalance independently), so a clustering member holds each of its queues'
broker lock (LOCK_BATCH_MQ) before it pulls it, renews every lock it holds every 20 s, and
stops consuming a queue whose lock it could not renew for 30 s.  Giving a queue up waits for
the listener call in progress, commits, and only then unlocks, so the next owner starts
exactly after the last message consumed here.  Broadcasting members each consume everything
and need no locks.

Each queue has at most one consume task.  A message the listener suspends
(SUSPEND_CURRENT_QUEUE_A_MOMENT, or an exception) is put back and offered again after a pause,
before anything behind it; it counts one reconsume per try, and once it has been tried
``max_reconsume_times`` times it goes to the group's DLQ (via send-back) and the queue moves
on, as RocketMQ's orderly consumer does.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import attrs

from evq import logs
from evq.client.group import TO_DLQ, GroupMember, MessageModel
from evq.client.offsets import OffsetStore
from evq.client.process_queue import ProcessQueue
from evq.client.supervision import Supervisor
from evq.domain.clock import Clock
from evq.domain.message import Message
from evq.domain.queues import MessageQueue

log = logs.get_logger(__name__)

LOCK_RENEW_S: Final = 20.0
SUSPEND_S: Final = 1.0
STOP_WAIT_S: Final = 10.0
"""How long giving a queue up waits for its listener call before unlocking anyway."""


class OrderlyResult(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@attrs.frozen(slots=True)
class Orderly:
    """An orderly listener, wrapped so that ``register_listener`` knows which mode to run."""

    listener: Callable[[list[Message]], Awaitable[OrderlyResult]]


class OrderlyConsumption:
    def __init__(self, member: GroupMember, listener: Orderly, offsets: OffsetStore,
                 clock: Clock, supervisor: Supervisor, *, suspend_s: float,
                 max_reconsume_times: int) -> None:
        self._member = member
        self._supervisor = supervisor
        self._listener = listener.listener
        self._offsets = offsets
        self._clock = clock
        self._suspend_s = suspend_s
        self._max_reconsume_times = max_reconsume_times
        self._tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._closing = False
        self._halting: set[MessageQueue] = set()

    @property
    def locking(self) -> bool:
        return self._member.model is MessageModel.CLUSTERING

    def may_consume(self, pq: ProcessQueue) -> bool:
        return not pq.dropped and (not self.locking or (
            pq.locked and not pq.lock_expired(self._clock.monotonic())))

    async def lock(self, queues: Mapping[MessageQueue, ProcessQueue]) -> set[MessageQueue]:
        """Lock (or renew) ``queues``; the queues held now.  A renewed queue with messages
        waiting resumes consuming; a queue another member holds stops at once; a queue whose
        broker did not answer keeps its lock until it expires here."""
        if not self.locking:
            return set(queues)
        held, refused = await self._member.lock(queues)
        now = self._clock.monotonic()
        for q, pq in queues.items():
            if q in held:
                pq.locked, pq.locked_at = True, now
                self.wake(q, pq)
            elif q in refused or pq.lock_expired(now):
                pq.locked = False
        return held

    def wake(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        """Make sure a task consumes ``queue`` while it has messages."""
        task = self._tasks.get(queue)
        if ((task is None or task.done()) and pq.count and self.may_consume(pq)
                and queue not in self._halting):
            self._tasks[queue] = self._supervisor.task(f"orderly consume {queue}",
                                                       self._run(queue, pq))

    async def stop(self, queue: MessageQueue) -> None:
        """Let ``queue``'s consume task finish the message in hand (committing it, unless the
        queue was dropped meanwhile) and end."""
        task = self._tasks.pop(queue, None)
        if task is None or task.done():
            return
        self._halting.add(queue)
        try:
            await asyncio.wait({task}, timeout=STOP_WAIT_S)
        finally:
            self._halting.discard(queue)

    async def close(self) -> None:
        """Let every queue finish (and commit) the message in hand, then consume no more."""
        self._closing = True
        if running := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.wait(running, timeout=STOP_WAIT_S)
        self._tasks.clear()

    async def unlock(self, queues: list[MessageQueue]) -> None:
        if self.locking and queues:
            await self._member.unlock(queues)

    async def _run(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        while (not self._closing and queue not in self._halting and self.may_consume(pq)
               and (msgs := pq.take(1))):
            try:
                result = await self._listener(msgs)
            except Exception:
                log.exception("orderly listener failed", group=self._member.group, queue=queue)
                result = OrderlyResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
            if pq.dropped:
                return
            if result is OrderlyResult.SUCCESS or await self._give_up(queue, msgs):
                self._offsets.update(queue, pq.commit())
                continue
            pq.put_back()
            await asyncio.sleep(self._suspend_s)
        if not (self._closing or queue in self._halting or pq.dropped or self.may_consume(pq)):
            log.warning("orderly consumption paused: queue lock lost", queue=queue)

    async def _give_up(self, queue: MessageQueue, msgs: list[Message]) -> bool:
        """True when every suspended message has used its tries and is now in the DLQ;
        otherwise count one more try on each."""
        done = True
        for m in msgs:
            if m.reconsume_times >= self._max_reconsume_times and await self._member.send_back(
                    queue, m, delay_level=TO_DLQ, max_reconsume_times=self._max_reconsume_times):
                log.warning("orderly message sent to the DLQ", queue=queue,
                            offset=m.queue_offset, tries=m.reconsume_times + 1)
                continue
            m.reconsume_times += 1
            done = False
        return done
