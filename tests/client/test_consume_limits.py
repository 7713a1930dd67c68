"""Flow control and the consume timeout of a push consumer against a real name server and
broker."""

from __future__ import annotations

import asyncio

import attrs

from evq.client.consumer import ConsumeFrom, ConsumeResult, ConsumerOptions, PushConsumer
from evq.client.flow_control import FlowLimits
from evq.domain.message import Message
from tests.client.conftest import Served
from tests.client.inbox import Inbox, send_keyed

BATCH = 4
OPTIONS = ConsumerOptions(rebalance_s=0.5, retry_delay_level=1, pull_batch_size=BATCH,
                          consume_from=ConsumeFrom.FIRST_OFFSET)


async def watch(c: PushConsumer, topic: str, stop: asyncio.Event) -> tuple[int, int]:
    """The largest cached count and offset span any queue of ``topic`` reached."""
    most = span = 0
    while not stop.is_set():
        for q in c.assigned:
            if q.topic == topic and (pq := c.process_queue(q)) is not None:
                most, span = max(most, pq.count), max(span, pq.span)
        await asyncio.sleep(0.005)
    return most, span


async def test_a_slow_listener_keeps_the_cache_under_the_count_limit(cluster: Served) -> None:
    n = 120
    await send_keyed(cluster.namesrv, "F1", [b"%d" % i for i in range(n)], ["k"] * n)
    inbox = Inbox()

    async def slow(msgs: list[Message]) -> ConsumeResult:
        await asyncio.sleep(0.005)
        return await inbox(msgs)

    options = attrs.evolve(OPTIONS, consume_concurrency=2,
                           flow_limits=FlowLimits(max_count=10))
    c = PushConsumer("GF1", cluster.namesrv, listener=slow, options=options)
    c.subscribe("F1")
    stop = asyncio.Event()
    async with c:
        watcher = asyncio.create_task(watch(c, "F1", stop))
        await inbox.until(n, timeout=30)
        stop.set()
        most, _ = await watcher
    # checked before each pull, so one batch may land on top of the limit
    assert 10 <= most <= 10 + BATCH
    assert sorted(inbox.payloads()) == sorted(b"%d" % i for i in range(n))


async def test_one_stuck_message_bounds_how_far_its_queue_runs_ahead(cluster: Served) -> None:
    n, max_span = 100, 20
    await send_keyed(cluster.namesrv, "F2", [b"%d" % i for i in range(n)], ["k"] * n)
    release = asyncio.Event()
    stuck: list[Message] = []
    inbox = Inbox()

    async def stuck_on_first(msgs: list[Message]) -> ConsumeResult:
        if msgs[0].payload() == b"0":
            stuck.append(msgs[0])
            await release.wait()
        return await inbox(msgs)

    def ahead() -> list[Message]:
        """Messages of the stuck message's queue consumed past it."""
        return [m for m in inbox.got if m.queue_id == stuck[0].queue_id
                and m.queue_offset > stuck[0].queue_offset]

    options = attrs.evolve(OPTIONS, consume_concurrency=4,
                           flow_limits=FlowLimits(max_span=max_span))
    c = PushConsumer("GF2", cluster.namesrv, listener=stuck_on_first, options=options)
    c.subscribe("F2")
    stop = asyncio.Event()
    async with c:
        watcher = asyncio.create_task(watch(c, "F2", stop))
        async with asyncio.timeout(20):
            while not stuck or len(ahead()) < max_span:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the window in which the queue would run on, unchecked
        assert len(ahead()) <= max_span + BATCH
        release.set()
        await inbox.until(n)
        stop.set()
        _, span = await watcher
    assert max_span <= span <= max_span + BATCH
    assert sorted(inbox.payloads()) == sorted(b"%d" % i for i in range(n))


async def test_a_listener_past_the_consume_timeout_is_cancelled_and_sent_back(
        cluster: Served) -> None:
    await send_keyed(cluster.namesrv, "F3", [b"slow", b"fast"], ["k", "k"])
    inbox = Inbox()
    cancelled: list[bytes] = []

    async def listener(msgs: list[Message]) -> ConsumeResult:
        if msgs[0].payload() == b"slow" and msgs[0].reconsume_times == 0:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(msgs[0].payload())
                raise
        return await inbox(msgs)

    options = attrs.evolve(OPTIONS, consume_timeout_s=0.3)
    c = PushConsumer("GF3", cluster.namesrv, listener=listener, options=options)
    c.subscribe("F3")
    async with c:
        await inbox.until(2, timeout=15)
    assert cancelled == [b"slow"]
    assert sorted((m.payload(), m.reconsume_times) for m in inbox.got) == [
        (b"fast", 0), (b"slow", 1)]
