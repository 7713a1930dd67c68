"""Long polling end to end: a pull parked at the broker on an empty queue is answered as soon as
a message arrives, by the broker waking it, not by the client asking again.  The consumer
reaches the name server and the broker through counting relays, so the number of
PULL_MESSAGE requests it sent is seen on the wire; the producer goes straight to them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from evq.client.consumer import ConsumeFrom, ConsumerOptions, PushConsumer
from evq.client.producer import Producer
from evq.client.pull_consumer import PullConsumer
from evq.domain.message import new_message
from evq.net.codes import RequestCode
from tests.client.conftest import Served
from tests.client.inbox import Inbox, routed_queues
from tests.client.relay import Relay, relay

HOLD_MS = 10_000
"""Far longer than the test waits: an answer that comes sooner was woken by the message."""
PARKED_S = 2.0
"""How long a pull is left parked before the message is sent."""
WOKEN_WITHIN_S = 1.0


@asynccontextmanager
async def through_relays(cluster: Served) -> AsyncIterator[tuple[str, Relay]]:
    """A name server address whose routes lead to the broker through a counting relay."""
    async with (relay(cluster.broker) as to_broker,
                relay(cluster.namesrv, {cluster.broker: to_broker.address}) as to_namesrv):
        yield to_namesrv.address, to_broker


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def pulls(to_broker: Relay) -> int:
    return to_broker.requests[RequestCode.PULL_MESSAGE]


async def test_a_parked_poll_is_answered_when_the_message_arrives(cluster: Served) -> None:
    async with Producer("PG-lp1", cluster.namesrv) as producer:
        await producer.send_to_queue(new_message("LP1", b"before"), 0)
        async with (through_relays(cluster) as (namesrv, to_broker),
                    PullConsumer("G-lp1", namesrv, auto_commit=False) as pc):
            queue = (await routed_queues(pc, "LP1"))[0]
            await pc.assign([queue])
            await pc.seek_to_end(queue)
            polling = asyncio.create_task(pc.poll(queue, wait_ms=HOLD_MS))
            await asyncio.sleep(PARKED_S)
            assert not polling.done(), "the broker answered at once instead of holding the pull"
            sent = time.monotonic()
            await producer.send_to_queue(new_message("LP1", b"while parked"), 0)
            result = await polling
            took = time.monotonic() - sent
            assert pulls(to_broker) == 1
    assert [m.payload() for m in result.messages] == [b"while parked"]
    assert took < WOKEN_WITHIN_S


async def test_a_push_consumer_is_woken_by_the_broker(cluster: Served) -> None:
    inbox = Inbox()
    async with Producer("PG-lp2", cluster.namesrv) as producer:
        await producer.send(new_message("LP2", b"before"))
        async with through_relays(cluster) as (namesrv, to_broker):
            consumer = PushConsumer("G-lp2", namesrv, listener=inbox, options=ConsumerOptions(
                consume_from=ConsumeFrom.FIRST_OFFSET))
            consumer.subscribe("LP2")
            async with consumer:
                await inbox.until(1)
                # one pull per queue, and one more after the queue that held "before"
                parked = len(consumer.assigned) + 1
                await until(lambda: pulls(to_broker) == parked)
                await asyncio.sleep(PARKED_S)
                assert pulls(to_broker) == parked, "parked pulls were sent again"
                sent = time.monotonic()
                await producer.send(new_message("LP2", b"while parked"))
                await inbox.until(2)
                took = time.monotonic() - sent
                # the woken pull came back and its queue's next pull parked in its place
                await until(lambda: pulls(to_broker) == parked + 1)
                await asyncio.sleep(PARKED_S / 4)
                assert pulls(to_broker) == parked + 1
    assert inbox.payloads() == [b"before", b"while parked"]
    assert took < WOKEN_WITHIN_S
