"""Orderly push consumers against a real name server and broker: order under a failing message,
the DLQ escape, and queue locks that keep two members off one queue."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from evq.client.consumer import ConsumeFrom, ConsumerOptions, PushConsumer
from evq.client.orderly import Orderly, OrderlyResult
from evq.client.pulling import PullStatus, Subscription, parse_pull, pull_request
from evq.client.routes import BrokerPool
from evq.domain import topics as tp
from evq.domain.message import Message
from evq.domain.queues import MessageQueue
from tests.client.conftest import Served
from tests.client.inbox import send_keyed

ORDERLY = ConsumerOptions(rebalance_s=0.5, lock_renew_s=0.5, suspend_s=0.05,
                          max_reconsume_times=2, consume_from=ConsumeFrom.FIRST_OFFSET)


async def dead_letters(broker: str, group: str) -> list[Message]:
    """The group's DLQ, read straight from the broker (its route may not be registered yet)."""
    dlq = tp.dlq_topic(group)
    pool = BrokerPool()
    try:
        answer = await pool.invoke(broker, pull_request(
            "DLQ-READER", MessageQueue(dlq, "", 0), 0, Subscription(dlq), suspend_ms=0))
    finally:
        await pool.close()
    result = parse_pull(answer, Subscription(dlq))
    return result.messages if result.status is PullStatus.FOUND else []


async def test_a_failing_message_is_retried_in_place_then_dead_lettered(cluster: Served) -> None:
    bodies = [b"%d" % i for i in range(8)]
    await send_keyed(cluster.namesrv, "O1", bodies, ["one key"] * len(bodies))
    seen: list[tuple[bytes, int]] = []
    done = asyncio.Event()

    async def listener(msgs: list[Message]) -> OrderlyResult:
        seen.extend((m.payload(), m.reconsume_times) for m in msgs)
        if msgs[-1].payload() == b"7":
            done.set()
        if msgs[0].payload() == b"3":
            return OrderlyResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return OrderlyResult.SUCCESS

    c = PushConsumer("GO1", cluster.namesrv, listener=Orderly(listener), options=ORDERLY)
    c.subscribe("O1")
    async with c:
        await asyncio.wait_for(done.wait(), 20)
    # 3 is offered max_reconsume_times + 1 times, nothing overtakes it, then the queue goes on
    assert seen == [(b"0", 0), (b"1", 0), (b"2", 0), (b"3", 0), (b"3", 1), (b"3", 2),
                    (b"4", 0), (b"5", 0), (b"6", 0), (b"7", 0)]
    assert [m.payload() for m in await dead_letters(cluster.broker, "GO1")] == [b"3"]


async def test_two_orderly_members_never_consume_one_queue_at_once(cluster: Served) -> None:
    keys = [f"key-{i}" for i in range(8)]
    await send_keyed(cluster.namesrv, "O2", [b"a%d" % i for i in range(8)], keys)
    active: dict[int, str] = {}
    overlaps: list[int] = []
    offsets: dict[int, list[int]] = defaultdict(list)
    total = 0
    arrived = asyncio.Condition()

    def listener_of(name: str) -> Orderly:
        async def listener(msgs: list[Message]) -> OrderlyResult:
            nonlocal total
            qid = msgs[0].queue_id
            if active.setdefault(qid, name) != name:
                overlaps.append(qid)
            await asyncio.sleep(0.01)  # long enough for another member to overlap
            offsets[qid] += [m.queue_offset for m in msgs]
            del active[qid]
            async with arrived:
                total += len(msgs)
                arrived.notify_all()
            return OrderlyResult.SUCCESS
        return Orderly(listener)

    members = [PushConsumer("GO2", cluster.namesrv, listener=listener_of(n), options=ORDERLY,
                            client_id=f"cid-{n}") for n in "ab"]
    for c in members:
        c.subscribe("O2")
    async with members[0]:
        async with asyncio.timeout(20), arrived:
            await arrived.wait_for(lambda: total >= 8)
        async with members[1]:
            await send_keyed(cluster.namesrv, "O2", [b"b%d" % i for i in range(80)], keys * 10)
            async with asyncio.timeout(30), arrived:
                await arrived.wait_for(lambda: total >= 88)
            owners = [{q.queue_id for q in c.assigned if q.topic == "O2"} for c in members]
    assert not overlaps
    assert owners[0] and owners[1] and not owners[0] & owners[1]
    # each queue consumed once, in order, across the hand-over
    assert all(seq == sorted(set(seq)) for seq in offsets.values())
    assert sum(len(seq) for seq in offsets.values()) == 88
