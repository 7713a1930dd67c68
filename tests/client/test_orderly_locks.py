"""Orderly consumption stops on a queue whose lock has expired here, and resumes once it is
renewed; driven by a ManualClock, with no broker (nothing here talks to one)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evq.client.group import ConsumeFrom, ConsumeType, GroupMember, MessageModel
from evq.client.offsets import LocalOffsets
from evq.client.orderly import Orderly, OrderlyConsumption, OrderlyResult
from evq.client.process_queue import LOCK_MAX_LIVE_S, ProcessQueue
from evq.client.routes import BrokerPool, Routes
from evq.client.supervision import Supervisor
from evq.domain.clock import ManualClock
from evq.domain.message import Message
from evq.domain.queues import MessageQueue

QUEUE = MessageQueue("T", "b", 0)


async def test_an_expired_lock_stops_consumption_until_renewed(tmp_path: Path) -> None:
    clock = ManualClock()
    seen: list[int] = []
    consumed = asyncio.Condition()

    async def listener(msgs: list[Message]) -> OrderlyResult:
        async with consumed:
            seen.extend(m.queue_offset for m in msgs)
            consumed.notify_all()
        if len(seen) == 2:  # time passes with no renewal while this message is consumed
            clock.advance(LOCK_MAX_LIVE_S + 1)
        return OrderlyResult.SUCCESS

    routes, pool = Routes("127.0.0.1:1"), BrokerPool()
    member = GroupMember("G", "cid", routes, pool, namesrv="127.0.0.1:1", subscriptions={},
                         consume_type=ConsumeType.PASSIVELY, model=MessageModel.CLUSTERING,
                         consume_from=ConsumeFrom.FIRST_OFFSET, strategy="AVG")
    offsets = LocalOffsets(tmp_path / "offsets.json")
    orderly = OrderlyConsumption(member, Orderly(listener), offsets, clock, Supervisor("test"),
                                 suspend_s=0, max_reconsume_times=1)
    pq = ProcessQueue(0)
    pq.put([Message(topic="T", queue_offset=o) for o in range(5)], 5)

    orderly.wake(QUEUE, pq)  # not locked yet: nothing happens
    await asyncio.sleep(0)
    assert seen == []

    pq.locked, pq.locked_at = True, clock.monotonic()
    orderly.wake(QUEUE, pq)
    async with asyncio.timeout(5), consumed:
        await consumed.wait_for(lambda: len(seen) == 2)
    for _ in range(20):  # every chance to take the next message, were it allowed to
        await asyncio.sleep(0)
    assert (seen, pq.count, offsets.get(QUEUE)) == ([0, 1], 3, 2)
    assert not orderly.may_consume(pq)

    pq.locked_at = clock.monotonic()  # what a successful renewal records
    orderly.wake(QUEUE, pq)
    async with asyncio.timeout(5), consumed:
        await consumed.wait_for(lambda: len(seen) == 5)
    await orderly.close()
    assert (seen, pq.count, offsets.get(QUEUE)) == ([0, 1, 2, 3, 4], 0, 5)
    await pool.close()
    await routes.close()
