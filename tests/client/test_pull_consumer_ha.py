"""A pull consumer through a master kill, in real processes: its polls go on from the slave
(slaveReadEnable), the slave answers its seeks and takes its commits, and the returned master
holds them, so a consumer started afterwards neither skips nor reads again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from evq.client.pull_consumer import PullConsumer
from evq.client.routes import Routes
from tests.client.inbox import produce
from tests.ha.group import Group, broker_group, committed, wait_caught_up

TOPIC = "HaPull"
GROUP = "ha-pullers"
QUEUES = 4  # the producer's defaultTopicQueueNums
PER_PHASE = 40
WAIT_S = 30.0


async def routed_with_slave(namesrv: str) -> None:
    """Until the name server routes the topic to both brokers: an assigned pull consumer
    never refreshes its routes, so the slave must be in the first one it reads."""
    routes = Routes(namesrv)
    try:
        async with asyncio.timeout(WAIT_S):
            while not any(len(ids) == 2 for ids in (await routes.lookup(TOPIC)).brokers.values()):
                await asyncio.sleep(0.2)
    finally:
        await routes.close()


async def poll(pc: PullConsumer, seen: Counter[bytes], n: int) -> None:
    """Poll every assigned queue until ``n`` more messages came (any poll error fails)."""
    want = sum(seen.values()) + n
    async with asyncio.timeout(WAIT_S):
        while sum(seen.values()) < want:
            seen.update(m.payload() for m in await pc.poll_all(wait_ms=500))


async def committed_sum(addr: str) -> int:
    return sum(max(o, 0) for o in await committed(addr, GROUP, TOPIC, QUEUES))


async def until_committed(addr: str, total: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while await committed_sum(addr) != total:
            await asyncio.sleep(0.1)


async def scenario(group: Group) -> Counter[bytes]:
    seen: Counter[bytes] = Counter()
    await produce(group.namesrv, TOPIC, [b"A%d" % i for i in range(PER_PHASE)])
    await routed_with_slave(group.namesrv)
    async with PullConsumer(GROUP, group.namesrv, auto_commit=False) as pc:
        await pc.assign(await pc.queues(TOPIC))
        await poll(pc, seen, PER_PHASE)
        await pc.commit()
        before_b = time.time_ns() // 1_000_000
        await produce(group.namesrv, TOPIC, [b"B%d" % i for i in range(PER_PHASE)])
        # the slave has taken the topic and the first commits from the master's log
        # (metadata it applies a moment after the bytes arrive)
        await until_committed(group.slave_addr, PER_PHASE)
        await asyncio.to_thread(wait_caught_up, group)
        await asyncio.to_thread(group.kill_master)
        # the first questions after the kill go to the dead master and are answered by the
        # slave: seeking to B's first store time lands every queue where it already was
        positions = pc.assignment
        for q in positions:
            await pc.seek_to_timestamp(q, before_b)
        assert pc.assignment == positions
        await poll(pc, seen, PER_PHASE)
        await pc.commit()
        assert await committed_sum(group.slave_addr) == 2 * PER_PHASE
    await asyncio.to_thread(group.start_master, "ASYNC_MASTER")
    await until_committed(group.master_addr, 2 * PER_PHASE)
    async with PullConsumer(GROUP, group.namesrv, auto_commit=False) as again:
        await again.assign(await again.queues(TOPIC))
        assert sum(again.assignment.values()) == 2 * PER_PHASE
        seen.update(m.payload() for m in await again.poll_all())
    return seen


@pytest.mark.slow
def test_pull_consumer_polls_and_commits_on_the_slave_while_the_master_is_down(
    tmp_path: Path,
) -> None:
    with broker_group(tmp_path) as group:
        group.start_master("ASYNC_MASTER")
        group.start_slave()
        seen = asyncio.run(scenario(group))
    assert set(seen) == {b"%s%d" % (p, i) for p in (b"A", b"B") for i in range(PER_PHASE)}
    assert max(seen.values()) == 1
