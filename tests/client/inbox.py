"""A recording listener and a quick producer, for the consumer tests."""

from __future__ import annotations

import asyncio
import time

from evq.client.consumer import ConsumeResult
from evq.client.errors import RouteNotFound
from evq.client.producer import Producer
from evq.client.pull_consumer import PullConsumer
from evq.domain.message import Message, new_message
from evq.domain.queues import MessageQueue


class Inbox:
    """What a listener received, awaitable until a condition holds."""

    def __init__(self, fail_first: set[bytes] = frozenset()) -> None:  # type: ignore[assignment]
        self.got: list[Message] = []
        self._fail = set(fail_first)
        self._changed = asyncio.Condition()

    async def __call__(self, msgs: list[Message]) -> ConsumeResult:
        async with self._changed:
            self.got += msgs
            self._changed.notify_all()
        if any(m.payload() in self._fail for m in msgs):
            self._fail -= {m.payload() for m in msgs}
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.CONSUME_SUCCESS

    def payloads(self) -> list[bytes]:
        return [m.payload() for m in self.got]

    async def until(self, n: int, timeout: float = 20) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.got) >= n)


async def produce(namesrv: str, topic: str, bodies: list[bytes], tags: str = "a") -> None:
    async with Producer("PG", namesrv) as p:
        for b in bodies:
            await p.send(new_message(topic, b, tags=tags))


async def send_keyed(namesrv: str, topic: str, bodies: list[bytes], keys: list[str]) -> None:
    async with Producer("PGO", namesrv) as p:
        for body, key in zip(bodies, keys, strict=True):
            await p.send_orderly(new_message(topic, body), key)


ROUTE_WAIT_S = 10.0


async def routed_queues(c: PullConsumer, topic: str) -> list[MessageQueue]:
    """``topic``'s queues once the name servers route it: a send that created the topic made
    the broker register it, and that registration may still be on its way."""
    async with asyncio.timeout(ROUTE_WAIT_S):
        while True:
            try:
                return await c.queues(topic)
            except RouteNotFound:
                await asyncio.sleep(0.05)  # the broker's registration, not yet arrived


OLD = [b"old-%d" % i for i in range(4)]
NEW = [b"new-%d" % i for i in range(4)]


async def old_then_new(namesrv: str, topic: str) -> int:
    """Send OLD, then (once the clock has passed their store times) NEW; the store time of
    the first NEW message, a timestamp that separates the two."""
    await produce(namesrv, topic, OLD)
    async with PullConsumer("PEEK", namesrv, auto_commit=False) as pc:
        async def stored() -> list[Message]:
            return [m for q in await routed_queues(pc, topic)
                    for m in (await pc.pull(q, 0)).messages]
        last_old = max(m.store_timestamp for m in await stored())
        while time.time_ns() // 1_000_000 <= last_old:
            await asyncio.sleep(0.001)
        await produce(namesrv, topic, NEW)
        return min(m.store_timestamp for m in await stored() if m.payload() in NEW)
