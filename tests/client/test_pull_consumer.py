"""Pull consumers against a real name server and broker: subscribed members splitting a topic,
seeks, automatic and manual commits."""

from __future__ import annotations

import asyncio

from evq.client.pull_consumer import PullConsumer
from evq.domain.message import Message
from evq.domain.queues import MessageQueue
from tests.client.conftest import Served
from tests.client.inbox import NEW, OLD, old_then_new, produce, routed_queues


async def committed_total(namesrv: str, group: str, queues: list[MessageQueue]) -> int:
    async with PullConsumer(group, namesrv, auto_commit=False) as pc:
        return sum([await pc.committed(q) for q in queues])


async def test_subscribed_members_split_the_topic_and_commit_on_close(cluster: Served) -> None:
    bodies = [b"%d" % i for i in range(20)]
    await produce(cluster.namesrv, "PS1", bodies)
    a, b = (PullConsumer("GPS1", cluster.namesrv, rebalance_s=0.5, client_id=f"cid-{n}")
            for n in "ab")
    for pc in (a, b):
        pc.subscribe("PS1")
    got: dict[str, list[Message]] = {"a": [], "b": []}
    async with a:
        queues = sorted(a.assignment)
        assert len(queues) == 4
        async with b:
            async with asyncio.timeout(20):
                while len(a.assignment) != 2 or len(b.assignment) != 2:
                    await asyncio.sleep(0.05)
            assert not set(a.assignment) & set(b.assignment)
            async with asyncio.timeout(20):
                while len(got["a"]) + len(got["b"]) < len(bodies):
                    got["a"] += await a.poll_all(wait_ms=200)
                    got["b"] += await b.poll_all(wait_ms=200)
            for name, pc in (("a", a), ("b", b)):
                assert {(m.topic, m.queue_id) for m in got[name]} <= {
                    (q.topic, q.queue_id) for q in pc.assignment}
    assert sorted(m.payload() for m in got["a"] + got["b"]) == sorted(bodies)
    assert await committed_total(cluster.namesrv, "GPS1", queues) == len(bodies)


async def test_seek_to_a_timestamp_and_to_the_beginning(cluster: Served) -> None:
    at = await old_then_new(cluster.namesrv, "PS2")
    async with PullConsumer("GPS2", cluster.namesrv, auto_commit=False) as pc:
        queues = await routed_queues(pc, "PS2")
        await pc.assign(queues)
        for q in queues:
            await pc.seek_to_end(q)
        assert await pc.poll_all() == []
        for q in queues:
            await pc.seek_to_timestamp(q, at)
        assert sorted(m.payload() for m in await pc.poll_all()) == sorted(NEW)
        for q in queues:
            await pc.seek_to_begin(q)
        assert sorted(m.payload() for m in await pc.poll_all()) == sorted(OLD + NEW)
    # auto_commit off: nothing was stored, closing included
    assert await committed_total(cluster.namesrv, "GPS2", queues) == 0


async def test_auto_commit_stores_positions_while_running(cluster: Served) -> None:
    await produce(cluster.namesrv, "PS3", [b"%d" % i for i in range(6)])
    async with PullConsumer("GPS3", cluster.namesrv, auto_commit_s=0.1) as pc:
        queues = await pc.queues("PS3")
        await pc.assign(queues)
        assert len(await pc.poll_all()) == 6
        async with asyncio.timeout(10):
            while sum([await pc.committed(q) for q in queues]) != 6:
                await asyncio.sleep(0.05)


async def test_manual_commit_stores_what_it_is_given(cluster: Served) -> None:
    await produce(cluster.namesrv, "PS4", [b"%d" % i for i in range(6)])
    async with PullConsumer("GPS4", cluster.namesrv, auto_commit=False) as pc:
        queues = await pc.queues("PS4")
        await pc.assign(queues)
        assert len(await pc.poll_all()) == 6
        await pc.commit({queues[0]: 1})
    assert await committed_total(cluster.namesrv, "GPS4", queues) == 1
