"""evq's client and the stock RocketMQ C++ client on one broker, both directions."""

from __future__ import annotations

import asyncio

from evq.client.blocking import SyncProducer
from evq.client.consumer import ConsumeResult, PushConsumer
from evq.client.producer import SendStatus
from evq.domain.message import Message, new_message
from tests.client.conftest import Served
from tests.client.test_push_consumer import FAST
from tests.compat.bodies import body_of
from tests.compat.conftest import stock


def stock_message(topic: str, i: int) -> Message:
    """What the stock driver's producer sends: tags T0..T2, key k<i>, property seq."""
    return new_message(topic, body_of(i), tags=f"T{i % 3}", keys=[f"k{i}"],
                       properties={"seq": str(i)})


def test_evq_sync_producer_to_stock_pull_consumer(cluster: Served) -> None:
    with SyncProducer("PG", cluster.namesrv) as p:
        results = [p.send(stock_message("X1", i)) for i in range(8)]
        results.append(p.send_batch([stock_message("X1", i) for i in range(8, 10)]))
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    got = stock("pull", cluster.namesrv, "X1", "G_stock_pull")
    assert sorted(int(m["seq"]) for m in got) == list(range(10))
    assert all(m["body_ok"] for m in got)  # compressed and non-ASCII bodies read by C++
    assert {(m["tags"], m["keys"]) for m in got} == {(f"T{i % 3}", f"k{i}") for i in range(10)}


async def test_stock_producer_to_evq_push_consumer(cluster: Served) -> None:
    sent = await asyncio.to_thread(stock, "produce", cluster.namesrv, "X2", "sync", "10")
    assert [s["status"] for s in sent] == ["OK"] * 10
    got: list[Message] = []
    all_in = asyncio.Event()

    async def listener(msgs: list[Message]) -> ConsumeResult:
        got.extend(msgs)
        if len(got) >= 10:
            all_in.set()
        return ConsumeResult.CONSUME_SUCCESS

    c = PushConsumer("G_evq_push", cluster.namesrv, listener=listener, options=FAST)
    c.subscribe("X2", "T0 || T1 || T2")
    async with c, asyncio.timeout(20):
        await all_in.wait()
    by_seq = {int(m.properties["seq"]): m for m in got}
    assert sorted(by_seq) == list(range(10))
    assert all(m.payload() == body_of(i) and m.tags == f"T{i % 3}" and m.keys == [f"k{i}"]
               for i, m in by_seq.items())
