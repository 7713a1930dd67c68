"""An administrator's reset-by-time (INVOKE_BROKER_TO_RESET_OFFSET) observed by running push
and pull consumers, against a real name server and broker."""

from __future__ import annotations

import asyncio

from evq.client.consumer import ConsumeFrom, ConsumerOptions, PushConsumer
from evq.client.offsets import reset_offsets
from evq.client.pull_consumer import PullConsumer
from evq.client.pulling import PullStatus
from evq.client.routes import BrokerPool
from evq.domain.codes import ResponseCode
from evq.domain.queues import MessageQueue
from evq.net.codes import RequestCode
from evq.net.headers.admin import ResetOffsetRequest
from evq.net.protocol import RemotingCommand
from tests.client.conftest import Served
from tests.client.inbox import NEW, Inbox, old_then_new


async def reset_by_time(broker: str, group: str, topic: str, timestamp_ms: int
                        ) -> dict[MessageQueue, int]:
    pool = BrokerPool()
    try:
        answer = await pool.invoke(broker, RemotingCommand.request(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            ResetOffsetRequest.write(topic=topic, group=group, timestamp=timestamp_ms)))
    finally:
        await pool.close()
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return reset_offsets(answer.body)


async def test_a_running_push_consumer_consumes_again_from_the_reset(cluster: Served) -> None:
    at = await old_then_new(cluster.namesrv, "RS1")
    inbox = Inbox()
    c = PushConsumer("GRS1", cluster.namesrv, listener=inbox,
                     options=ConsumerOptions(consume_from=ConsumeFrom.FIRST_OFFSET))
    c.subscribe("RS1")
    async with c:
        await inbox.until(8)
        await c.persist()  # a stale commit the reset must win over
        moved = await reset_by_time(cluster.broker, "GRS1", "RS1", at)
        assert moved
        await inbox.until(12, timeout=10)  # well inside the 15 s a parked pull waits
        await c.persist()
    assert sorted(inbox.payloads()[8:]) == sorted(NEW)
    async with PullConsumer("GRS1", cluster.namesrv, auto_commit=False) as pc:
        assert sum([await pc.committed(q) for q in moved]) == 8


async def test_a_running_pull_consumer_moves_to_the_reset(cluster: Served) -> None:
    at = await old_then_new(cluster.namesrv, "RS2")
    subscribed = PullConsumer("GRS2", cluster.namesrv, auto_commit=False)
    subscribed.subscribe("RS2")
    assigned = PullConsumer("GRS2B", cluster.namesrv, auto_commit=False)
    async with subscribed, assigned:
        await assigned.assign(await assigned.queues("RS2"))
        for pc in (subscribed, assigned):
            assert len(await pc.poll_all()) == 8
        for group in ("GRS2", "GRS2B"):
            await reset_by_time(cluster.broker, group, "RS2", at)
        # told by RESET_CONSUMER_CLIENT_OFFSET: the positions moved already
        async with asyncio.timeout(10):
            while sum(subscribed.assignment.values()) == 8:
                await asyncio.sleep(0.01)
        assert sorted(m.payload() for m in await subscribed.poll_all()) == sorted(NEW)
        # not a member, so not told: the next poll at the old position is moved
        results = [await assigned.poll(q) for q in sorted(assigned.assignment)]
        assert not any(r.messages for r in results)
        assert PullStatus.OFFSET_ILLEGAL in {r.status for r in results}
        assert sorted(m.payload() for m in await assigned.poll_all()) == sorted(NEW)
