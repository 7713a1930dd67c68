"""Rebalance against a real name server and broker: a topic that appears after the consumer
started, members joining and leaving, strategies other than AVG, a topic that grows."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from evq.admin.operations import Admin
from evq.client.consumer import ConsumeFrom, ConsumerOptions, PushConsumer
from evq.client.producer import Producer
from evq.domain import topics as tp
from evq.domain.queues import MessageQueue
from evq.domain.rebalance import allocate
from tests.client.conftest import Served
from tests.client.inbox import Inbox, produce

TOPIC_QUEUES = 4  # an auto-created topic takes TBW102's route, capped at 4 queues


async def test_a_topic_created_after_start_is_consumed_within_seconds(cluster: Served) -> None:
    inbox = Inbox()
    # The default 20 s period: only the retry of an unsettled round can be this quick.
    c = PushConsumer("GR1", cluster.namesrv, listener=inbox,
                     options=ConsumerOptions(consume_from=ConsumeFrom.FIRST_OFFSET))
    c.subscribe("R1")
    async with c:
        assert not {q for q in c.assigned if q.topic == "R1"}
        await produce(cluster.namesrv, "R1", [b"late"])
        await inbox.until(1, timeout=8)
        await _settled([c], "R1")
    assert inbox.payloads() == [b"late"]


def _owned(c: PushConsumer, topic: str) -> set[MessageQueue]:
    return {q for q in c.assigned if q.topic == topic}


async def _settled(members: list[PushConsumer], topic: str) -> None:
    """Until every queue of ``topic`` has exactly one owner among ``members``."""
    async with asyncio.timeout(20):
        while True:
            shares = [_owned(c, topic) for c in members]
            disjoint = all(not a & b for a, b in itertools.combinations(shares, 2))
            if disjoint and len(set().union(*shares)) == TOPIC_QUEUES:
                return
            await asyncio.sleep(0.05)


async def test_members_join_and_leave_and_every_queue_keeps_one_owner(cluster: Served) -> None:
    await produce(cluster.namesrv, "R2", [b"x"])
    options = ConsumerOptions(rebalance_s=2, consume_from=ConsumeFrom.FIRST_OFFSET)
    members = [PushConsumer("GR2", cluster.namesrv, listener=Inbox(), options=options,
                            client_id=f"cid-{i}") for i in range(3)]
    for c in members:
        c.subscribe("R2")
    started: list[PushConsumer] = []
    try:
        for c in members:
            await c.start()
            started.append(c)
            await _settled(started, "R2")
        assert sorted(len(_owned(c, "R2")) for c in members) == [1, 1, 2]
        leaving = started.pop(1)
        await leaving.shutdown()
        await _settled(started, "R2")
        assert sorted(len(_owned(c, "R2")) for c in started) == [2, 2]
    finally:
        for c in started:
            await c.shutdown()


@pytest.mark.parametrize("strategy", ["AVG_BY_CIRCLE", "CONSISTENT_HASH"])
async def test_other_strategies_give_every_queue_one_owner(cluster: Served, strategy: str
                                                            ) -> None:
    """The members end up owning what the strategy gives each with all three in view.  On the
    way a round can already be complete and disjoint (a member that saw two members took
    queues 0 and 2, the others 1 and 3), so the test waits for the strategy's answer."""
    topic, group = f"R3{strategy}".replace("_", ""), "GR3" + strategy
    await produce(cluster.namesrv, topic, [b"x"])
    options = ConsumerOptions(rebalance_s=1, strategy=strategy)
    members = [PushConsumer(group, cluster.namesrv, listener=Inbox(), options=options)
               for _ in range(3)]
    for c in members:
        c.subscribe(topic)
    try:
        for c in members:
            await c.start()
        await _settled(members, topic)
        (broker_name,) = {q.broker_name for c in members for q in _owned(c, topic)}
        queues = [MessageQueue(topic, broker_name, i) for i in range(TOPIC_QUEUES)]
        ids = [c.client_id for c in members]
        want = [set(allocate(strategy, group, cid, queues, ids)) for cid in ids]
        try:
            async with asyncio.timeout(20):
                while [_owned(c, topic) for c in members] != want:
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pytest.fail(f"after 20 s the members own {[_owned(c, topic) for c in members]}, "
                        f"not {strategy}'s {want}")
        if strategy == "AVG_BY_CIRCLE":  # queue i to member i % 3, members in id order
            ordered = sorted(members, key=lambda c: c.client_id)
            assert [sorted(q.queue_id for q in _owned(c, topic)) for c in ordered] == [
                [0, 3], [1], [2]]
    finally:
        for c in members:
            await c.shutdown()


async def test_a_topic_that_grows_is_seen_within_the_refresh_period(cluster: Served) -> None:
    await produce(cluster.namesrv, "R4", [b"x"])
    fast = ConsumerOptions(route_refresh_s=0.5, rebalance_s=0.5)
    c = PushConsumer("GR4", cluster.namesrv, listener=Inbox(), options=fast)
    c.subscribe("R4")
    async with c, Producer("PG", cluster.namesrv, route_refresh_s=0.5) as p:
        await _settled([c], "R4")
        assert len(await p.publish_queues("R4")) == len(_owned(c, "R4")) == TOPIC_QUEUES
        async with Admin(cluster.namesrv) as admin:
            await admin.update_topic(tp.TopicConfig(topic_name="R4", read_queue_nums=8,
                                                    write_queue_nums=8),
                                     broker=cluster.broker)
        async with asyncio.timeout(3):  # a few periods, for the broker's registration too
            while len(await p.publish_queues("R4")) != 8 or len(_owned(c, "R4")) != 8:
                await asyncio.sleep(0.05)
