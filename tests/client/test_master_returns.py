"""A broker group's master killed mid-test and started again, with every client kind running.

On the two-group cluster of ``tests/cluster.py``: a clustering push consumer, a broadcasting
one, a pull consumer and an orderly consumer read while a producer sends.  broker-a's master
is SIGKILLed: the producer goes on through broker-b, the readers take broker-a's queues from
its slave (``slaveReadEnable``), the orderly consumer holds broker-a's queues (no master, no
lock).  The master then comes back on its data and port: a new producer's sends reach it
again, transactions end on it, the orderly consumer takes its queues back, and every reader
ends with every message (at least once; the orderly one with each key's order kept).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from pathlib import Path

from evq.client.consumer import MessageModel, PushConsumer
from evq.client.orderly import Orderly, OrderlyResult
from evq.client.producer import Producer, SendStatus
from evq.client.pull_consumer import PullConsumer
from evq.client.transactions import TransactionProducer
from evq.domain.message import Message, new_message
from tests.client.inbox import Inbox
from tests.client.test_on_a_cluster import FAST, CommitEven, spread_topic
from tests.cluster import GROUPS, Cluster, running_cluster

TOPIC, ORDERED = "CBack", "CBackOrder"
KEYS = [f"k{i}" for i in range(6)]
CATCH_UP_S = 90.0


async def send_range(c: Cluster, first: int, last: int) -> collections.Counter[str]:
    """Send bodies ``first..last-1`` from a new producer; how many each group took."""
    taken: collections.Counter[str] = collections.Counter()
    async with Producer("PG-back", c.namesrv) as p:
        for i in range(first, last):
            r = await p.send(new_message(TOPIC, b"%d" % i, tags="a"))
            assert r.status is SendStatus.SEND_OK
            taken[r.queue.broker_name] += 1
    return taken


async def send_ordered(c: Cluster, steps: range) -> set[str]:
    """Each key's ``steps``, in order, to its queue; the groups that took them."""
    groups = set()
    async with Producer("PG-back-order", c.namesrv) as p:
        for n in steps:
            for key in KEYS:
                r = await p.send_orderly(new_message(ORDERED, f"{key}:{n}".encode()), key)
                groups.add(r.queue.broker_name)
    return groups


def first_seen(values: list[int]) -> list[int]:
    """``values`` without repeats, in the order each first appeared."""
    return list(dict.fromkeys(values))


async def until(condition: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(CATCH_UP_S):
            while not condition():
                await asyncio.sleep(0.1)  # several readers' states: polled together
    except TimeoutError:
        raise AssertionError(f"waited {CATCH_UP_S:g} s for {what}") from None


def test_every_client_kind_rides_out_a_master_killed_and_returned(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as c:
        spread_topic(c, TOPIC)
        spread_topic(c, ORDERED)
        asyncio.run(ride_out(c, tmp_path))


async def ride_out(c: Cluster, tmp_path: Path) -> None:
    push, broadcast = Inbox(), Inbox()
    pulled: list[Message] = []
    ordered: dict[str, list[int]] = collections.defaultdict(list)

    async def in_order(msgs: list[Message]) -> OrderlyResult:
        for m in msgs:
            key, n = m.payload().decode().split(":")
            ordered[key].append(int(n))
        return OrderlyResult.SUCCESS

    consumers = [
        PushConsumer("G-back", c.namesrv, listener=push, options=FAST),
        PushConsumer("G-back-bc", c.namesrv, listener=broadcast, options=FAST,
                     model=MessageModel.BROADCASTING, offsets_file=tmp_path / "bc.json"),
        PushConsumer("G-back-order", c.namesrv, listener=Orderly(in_order), options=FAST),
    ]
    for consumer, topic in zip(consumers, (TOPIC, TOPIC, ORDERED), strict=True):
        consumer.subscribe(topic)
    async with consumers[0], consumers[1], consumers[2], \
            PullConsumer("G-back-pull", c.namesrv) as puller:
        await puller.assign(await puller.queues(TOPIC))

        async def pull_forever() -> None:
            while True:
                pulled.extend(await puller.poll_all(wait_ms=500))

        pulling = asyncio.create_task(pull_forever())
        assert set(await send_range(c, 0, 40)) == set(GROUPS)
        assert await send_ordered(c, range(3)) == set(GROUPS)

        master = c.masters["broker-a"]
        master.proc.kill()
        await asyncio.to_thread(master.proc.wait, 10)
        assert set(await send_range(c, 40, 80)) == {"broker-b"}  # the dead group is skipped

        await asyncio.to_thread(c.restart_master, "broker-a")
        after = await send_range(c, 80, 120)
        assert after["broker-a"] > 0, after  # the returned master takes sends again
        assert await send_ordered(c, range(3, 6)) == set(GROUPS)
        async with TransactionProducer("PG-back-tx", c.namesrv, CommitEven()) as tx:
            ended = {(await tx.send_in_transaction(new_message(TOPIC, b"%d" % i)))
                     .send.queue.broker_name for i in range(120, 132)}
        assert ended == set(GROUPS)

        # The committed (even) transactional messages join the plain ones; odd ones never.
        everything = {b"%d" % i for i in range(120)} | {b"%d" % i for i in range(120, 132, 2)}
        await until(lambda: set(push.payloads()) >= everything, "the push consumer")
        await until(lambda: set(broadcast.payloads()) >= everything, "the broadcast consumer")
        await until(lambda: {m.payload() for m in pulled} >= everything, "the pull consumer")
        await until(lambda: all(len(set(ordered[k])) == 6 for k in KEYS),
                    "the orderly consumer")
        pulling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pulling
    for got in (push.payloads(), broadcast.payloads(), [m.payload() for m in pulled]):
        assert set(got) == everything  # nothing lost, no rolled-back half delivered
    for key in KEYS:  # redelivered after the kill, perhaps, but never out of order
        assert first_seen(ordered[key]) == list(range(6)), (key, ordered[key])
