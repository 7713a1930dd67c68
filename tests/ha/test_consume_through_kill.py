"""A clustering consumer group through a master kill: it reads the slave (slaveReadEnable)
and commits there while the master is down, and the returned master takes those offsets, so
nothing is skipped and nothing is consumed again en masse."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from evq.client.consumer import ConsumeFrom, ConsumeResult, ConsumerOptions, PushConsumer
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


async def produce(namesrv: str, phase: str) -> set[str]:
    sent = set()
    async with Producer("ha-consume-producer", namesrv) as producer:
        for i in range(PER_PHASE):
            r = await producer.send(new_message(TOPIC, f"{phase}{i}".encode()))
            assert r.status is SendStatus.SEND_OK
            sent.add(f"{phase}{i}")
    return sent


async def consume(group: Group, seen: Counter[str], done: Callable[[], bool]) -> None:
    async def listener(msgs: list[Message]) -> ConsumeResult:
        seen.update(m.body.decode() for m in msgs)
        return ConsumeResult.CONSUME_SUCCESS

    consumer = PushConsumer(GROUP, group.namesrv, listener=listener, options=ConsumerOptions(
        persist_s=0.5, consume_from=ConsumeFrom.FIRST_OFFSET))
    consumer.subscribe(TOPIC)
    await consumer.start()
    try:
        await until(lambda: asyncio.sleep(0, done()), "consumption")
    finally:
        await consumer.shutdown()


async def offsets_sum(addr: str) -> int:
    return sum(max(o, 0) for o in await committed(addr, GROUP, TOPIC, QUEUES))


async def scenario(group: Group) -> Counter[str]:
    seen: Counter[str] = Counter()
    first = await produce(group.namesrv, "A")
    await consume(group, seen, lambda: first <= set(seen))
    await asyncio.to_thread(wait_caught_up, group)
    await until(lambda: _equals(offsets_sum(group.slave_addr), PER_PHASE),
                "the group's offsets on the slave")
    second = await produce(group.namesrv, "B")
    await asyncio.to_thread(wait_caught_up, group)
    await asyncio.to_thread(group.kill_master)
    await consume(group, seen, lambda: second <= set(seen))
    await until(lambda: _equals(offsets_sum(group.slave_addr), 2 * PER_PHASE),
                "the commits made on the slave")
    await asyncio.to_thread(group.start_master, "ASYNC_MASTER")
    await until(lambda: _equals(offsets_sum(group.master_addr), 2 * PER_PHASE),
                "the returned master to take the slave's offsets")
    await until(lambda: same_admin_answers(group, f"{TOPIC}@{GROUP}"),
                "the slave's admin answers")
    return seen


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


@pytest.mark.slow
def test_group_consumes_from_the_slave_while_the_master_is_down(tmp_path: Path) -> None:
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        group.start_slave()
        seen = asyncio.run(scenario(group))
    assert {f"B{i}" for i in range(PER_PHASE)} <= set(seen)
    again = sum(n - 1 for n in seen.values())
    print(f"consumed {sum(seen.values())}, again {again}")
    assert again == 0
