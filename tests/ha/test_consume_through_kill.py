"""One clustering push consumer running through a master kill and the master's return: it
reads the slave (slaveReadEnable) and commits there while the master is down, the returned
master takes those offsets, and the consumer goes on with new messages from it.  Nothing is
skipped, and only what was consumed since the last offset commit may be consumed again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import pytest

from evq.client.consumer import (
    PERSIST_S,
    ConsumeFrom,
    ConsumeResult,
    ConsumerOptions,
    PushConsumer,
)
from evq.client.flow_control import FlowLimits
from evq.client.producer import Producer, SendStatus
from evq.domain.message import Message, new_message
from tests.ha.group import (
    Group,
    broker_group,
    committed,
    same_admin_answers,
    until,
    wait_caught_up,
)

TOPIC = "HaConsume"
GROUP = "ha-consumers"
QUEUES = 4  # the producer's defaultTopicQueueNums
PER_PHASE = 200
CACHED = 8
"""Messages a queue holds in the consumer before it stops pulling: small, so most of the
phase sent before the kill can only come from the slave."""
SLACK_S = 1.0


@attrs.define
class Consumption:
    """What the listener saw: how often each body, and when first."""

    seen: Counter[str] = attrs.field(factory=Counter)
    first: dict[str, float] = attrs.field(factory=dict)
    gate: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Cleared: the listener waits (a consumer busy with earlier messages)."""

    async def listener(self, msgs: list[Message]) -> ConsumeResult:
        await self.gate.wait()
        now = time.monotonic()
        for m in msgs:
            body = m.body.decode()
            self.seen[body] += 1
            self.first.setdefault(body, now)
        return ConsumeResult.CONSUME_SUCCESS

    def holds(self, bodies: set[str]) -> Callable[[], Awaitable[bool]]:
        return lambda: asyncio.sleep(0, bodies <= set(self.seen))

    def consumed_within(self, moments: list[float]) -> set[str]:
        """Bodies first consumed in the persist interval (and a little) before a moment:
        their commits may not have reached a broker by then."""
        return {b for b, t in self.first.items()
                if any(m - PERSIST_S - SLACK_S <= t <= m + SLACK_S for m in moments)}


async def produce(namesrv: str, phase: str) -> set[str]:
    sent = set()
    async with Producer("ha-consume-producer", namesrv) as producer:
        for i in range(PER_PHASE):
            r = await producer.send(new_message(TOPIC, f"{phase}{i}".encode()))
            assert r.status is SendStatus.SEND_OK
            sent.add(f"{phase}{i}")
    return sent


async def offsets_sum(addr: str) -> int:
    return sum(max(o, 0) for o in await committed(addr, GROUP, TOPIC, QUEUES))


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def scenario(group: Group, c: Consumption) -> list[float]:
    """Runs the consumer through the kill and the return; returns when those happened."""
    consumer = PushConsumer(GROUP, group.namesrv, listener=c.listener, options=ConsumerOptions(
        consume_from=ConsumeFrom.FIRST_OFFSET, pull_batch_size=CACHED,
        flow_limits=FlowLimits(max_count=CACHED)))
    consumer.subscribe(TOPIC)
    c.gate.set()
    await consumer.start()
    try:
        first = await produce(group.namesrv, "A")
        await until(c.holds(first), "phase A consumed")
        c.gate.clear()
        second = await produce(group.namesrv, "B")
        await asyncio.to_thread(wait_caught_up, group)
        await asyncio.to_thread(group.kill_master)
        killed = time.monotonic()
        c.gate.set()
        await until(c.holds(second), "phase B consumed from the slave")
        await until(lambda: _equals(offsets_sum(group.slave_addr), 2 * PER_PHASE),
                    "the commits made on the slave")
        await asyncio.to_thread(group.start_master, "ASYNC_MASTER")
        returned = time.monotonic()
        await until(lambda: _equals(offsets_sum(group.master_addr), 2 * PER_PHASE),
                    "the returned master to take the slave's offsets")
        third = await produce(group.namesrv, "C")
        await until(c.holds(third), "phase C consumed from the returned master")
        await until(lambda: _equals(offsets_sum(group.master_addr), 3 * PER_PHASE),
                    "the consumer's commits on the returned master")
        await until(lambda: same_admin_answers(group, f"{TOPIC}@{GROUP}"),
                    "the slave's admin answers")
    finally:
        await consumer.shutdown()
    return [killed, returned]


@pytest.mark.slow
def test_consumer_runs_on_through_a_master_kill(tmp_path: Path) -> None:
    c = Consumption()
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        group.start_slave()
        moments = asyncio.run(scenario(group, c))
    assert set(c.seen) == {f"{p}{i}" for p in "ABC" for i in range(PER_PHASE)}
    again = {b for b, n in c.seen.items() if n > 1}
    assert again <= c.consumed_within(moments), sorted(again - c.consumed_within(moments))
