"""Clients against a real cluster: two name servers and two broker groups, each a master
with a slave (``tests/cluster.py``).  Producers spread over both groups, push consumers
(clustering and broadcasting) and pull consumers read every queue of both, orderly
consumption keeps each key's order across groups, transactions end on whichever group holds
their half, a reset by time moves a group back on both, and a group's master killed mid-test
costs neither the producer (it sends to the other group) nor the consumer (it reads the
dead master's queues from its slave)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

from evq.admin.operations import Admin
from evq.client.consumer import ConsumeFrom, ConsumerOptions, MessageModel, PushConsumer
from evq.client.orderly import Orderly, OrderlyResult
from evq.client.producer import Producer, SendStatus
from evq.client.pull_consumer import PullConsumer
from evq.client.transactions import TransactionProducer, TransactionState
from evq.domain.message import Message, new_message
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient, split_address
from tests.client.inbox import Inbox
from tests.cluster import GROUPS, Cluster, running_cluster
from tests.processes import run_evq

FAST = ConsumerOptions(rebalance_s=0.5, consume_from=ConsumeFrom.FIRST_OFFSET)
QUEUES_PER_GROUP = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


def spread_topic(c: Cluster, topic: str) -> None:
    """``topic`` with QUEUES_PER_GROUP queues on every master, as an operator creates it."""
    out = run_evq("admin", "updateTopic", "-n", c.namesrv, "-t", topic, "-c", "DefaultCluster",
                  "-r", str(QUEUES_PER_GROUP), "-w", str(QUEUES_PER_GROUP))
    assert out.returncode == 0, out.stderr


async def slave_caught_up(c: Cluster, broker_name: str, topic: str,
                          timeout: float = 20.0) -> None:
    """Wait until ``broker_name``'s slave holds every message its master holds in each of
    ``topic``'s queues."""

    async def max_offsets(client: RemotingClient) -> list[int]:
        offsets = []
        for queue_id in range(QUEUES_PER_GROUP):
            r = await client.invoke(RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id}), 5.0)
            offsets.append(int(r.ext_fields.get("offset", -1)))
        return offsets

    master = RemotingClient(*split_address(c.addr(broker_name)))
    slave = RemotingClient(*split_address(c.addr(broker_name, slave=True)))
    async with master, slave:
        want = await max_offsets(master)
        deadline = asyncio.get_running_loop().time() + timeout
        while (have := await max_offsets(slave)) != want:
            assert asyncio.get_running_loop().time() < deadline, (
                f"{broker_name}'s slave holds {have} of {topic}'s queues, its master {want}")
            await asyncio.sleep(0.05)


async def send_all(c: Cluster, topic: str, n: int) -> collections.Counter[str]:
    """Send ``n`` messages; how many each broker group took."""
    taken: collections.Counter[str] = collections.Counter()
    async with Producer("PG-cluster", c.namesrv) as p:
        for i in range(n):
            r = await p.send(new_message(topic, b"%d" % i, tags="a"))
            assert r.status is SendStatus.SEND_OK
            taken[r.queue.broker_name] += 1
    return taken


async def test_sends_spread_over_both_groups_and_two_members_get_everything(
        cluster: Cluster) -> None:
    spread_topic(cluster, "CSpread")
    taken = await send_all(cluster, "CSpread", 40)
    assert set(taken) == set(GROUPS)
    a, b = Inbox(), Inbox()
    members = [PushConsumer("G-spread", cluster.namesrv, listener=inbox, options=FAST)
               for inbox in (a, b)]
    for m in members:
        m.subscribe("CSpread")
    async with members[0], members[1]:
        async with asyncio.timeout(30):
            while len(a.got) + len(b.got) < 40:
                await asyncio.sleep(0.05)  # two inboxes: poll their sum
        owned = [{q for q in m.assigned if q.topic == "CSpread"} for m in members]
    # At least once: a queue moving between the members as they join may repeat a few.
    assert sorted(set(a.payloads() + b.payloads()), key=int) == [b"%d" % i for i in range(40)]
    assert sum(map(len, owned)) == 2 * QUEUES_PER_GROUP  # every queue of both groups, once
    assert not owned[0] & owned[1]


async def test_broadcasting_members_each_get_everything(cluster: Cluster, tmp_path: Path
                                                        ) -> None:
    spread_topic(cluster, "CBroadcast")
    await send_all(cluster, "CBroadcast", 16)
    inboxes = [Inbox(), Inbox()]
    members = [PushConsumer("G-bc", cluster.namesrv, listener=inbox, options=FAST,
                            model=MessageModel.BROADCASTING,
                            offsets_file=tmp_path / f"offsets-{i}.json")
               for i, inbox in enumerate(inboxes)]
    for m in members:
        m.subscribe("CBroadcast")
    async with members[0], members[1]:
        for inbox in inboxes:
            await inbox.until(16)
    for inbox in inboxes:
        assert sorted(inbox.payloads(), key=int) == [b"%d" % i for i in range(16)]


async def test_a_pull_consumer_reads_every_queue_of_both_groups(cluster: Cluster) -> None:
    spread_topic(cluster, "CPull")
    await send_all(cluster, "CPull", 24)
    async with PullConsumer("G-pull", cluster.namesrv) as pc:
        queues = await pc.queues("CPull")
        assert {q.broker_name for q in queues} == set(GROUPS)
        await pc.assign(queues)
        got: list[Message] = []
        while len(got) < 24:
            got += await pc.poll_all(wait_ms=500)
    assert sorted(m.payload() for m in got) == sorted(b"%d" % i for i in range(24))


async def test_orderly_consumption_keeps_each_keys_order(cluster: Cluster) -> None:
    spread_topic(cluster, "COrder")
    keys = [f"k{i}" for i in range(6)]
    async with Producer("PG-order", cluster.namesrv) as p:
        brokers = set()
        for n in range(5):
            for key in keys:
                r = await p.send_orderly(new_message("COrder", f"{key}:{n}".encode()), key)
                brokers.add(r.queue.broker_name)
    assert brokers == set(GROUPS)  # the keys' queues are on both groups
    seen: dict[str, list[int]] = collections.defaultdict(list)
    done = Inbox()

    async def in_order(msgs: list[Message]) -> OrderlyResult:
        for m in msgs:
            key, n = m.payload().decode().split(":")
            seen[key].append(int(n))
        await done(msgs)
        return OrderlyResult.SUCCESS

    c = PushConsumer("G-order", cluster.namesrv, listener=Orderly(in_order), options=FAST)
    c.subscribe("COrder")
    async with c:
        await done.until(len(keys) * 5)
    assert {k: v for k, v in seen.items()} == {k: list(range(5)) for k in keys}


def test_a_group_losing_its_master_costs_neither_producer_nor_consumer(tmp_path: Path) -> None:
    """Its own cluster: this test kills a master."""
    with running_cluster(tmp_path) as c:
        spread_topic(c, "CKill")
        before = asyncio.run(send_all(c, "CKill", 20))
        assert set(before) == set(GROUPS)
        # An ASYNC_MASTER acknowledges before its slave has the message: killed at once, it
        # may take the last few with it (the test then waited 40 s for them, 1 run in ~10).
        asyncio.run(slave_caught_up(c, "broker-a", "CKill"))
        c.masters["broker-a"].proc.kill()
        c.masters["broker-a"].proc.wait(10)

        async def after_the_kill() -> tuple[collections.Counter[str], list[bytes]]:
            taken: collections.Counter[str] = collections.Counter()
            async with Producer("PG-kill", c.namesrv) as p:
                for i in range(20, 40):
                    r = await p.send(new_message("CKill", b"%d" % i, tags="a"))
                    assert r.status is SendStatus.SEND_OK
                    taken[r.queue.broker_name] += 1
            inbox = Inbox()
            consumer = PushConsumer("G-kill", c.namesrv, listener=inbox, options=FAST)
            consumer.subscribe("CKill")
            async with consumer:
                await inbox.until(40, timeout=40)  # broker-a's share from its slave
            return taken, inbox.payloads()

        after, got = asyncio.run(after_the_kill())
        assert set(after) == {"broker-b"}  # the dead group's queues are skipped
        assert sorted(set(got), key=int) == [b"%d" % i for i in range(40)]


class CommitEven:
    """Commits the local transaction of even-numbered messages, rolls back the odd."""

    def execute(self, msg: Message, arg: object) -> TransactionState:
        return TransactionState.COMMIT if int(msg.payload()) % 2 == 0 else \
            TransactionState.ROLLBACK

    def check(self, msg: Message) -> TransactionState:
        return self.execute(msg, None)


async def test_transactions_end_on_whichever_group_holds_the_half(cluster: Cluster) -> None:
    spread_topic(cluster, "CTx")
    brokers = set()
    async with TransactionProducer("PG-tx", cluster.namesrv, CommitEven()) as p:
        for i in range(12):
            r = await p.send_in_transaction(new_message("CTx", b"%d" % i))
            brokers.add(r.send.queue.broker_name)
    assert brokers == set(GROUPS)
    async with PullConsumer("G-tx", cluster.namesrv) as pc:
        await pc.assign(await pc.queues("CTx"))
        got: list[Message] = []
        async with asyncio.timeout(20):
            while len(got) < 6:
                got += await pc.poll_all(wait_ms=500)
        got += await pc.poll_all(wait_ms=200)  # nothing else: the odd ones rolled back
    assert sorted(int(m.payload()) for m in got) == list(range(0, 12, 2))


async def test_reset_by_time_moves_the_group_back_on_both_groups(cluster: Cluster) -> None:
    spread_topic(cluster, "CReset")
    await send_all(cluster, "CReset", 16)
    first = Inbox()
    c = PushConsumer("G-reset", cluster.namesrv, listener=first, options=FAST)
    c.subscribe("CReset")
    async with c:
        await first.until(16)
    async with Admin(cluster.namesrv) as admin:
        rows = await admin.reset_offset_by_time("G-reset", "CReset", 0)
    assert {r.broker_name for r in rows} == set(GROUPS)
    assert all(r.offset == 0 for r in rows)
    again = Inbox()
    c = PushConsumer("G-reset", cluster.namesrv, listener=again, options=FAST)
    c.subscribe("CReset")
    async with c:
        await again.until(16)
    assert sorted(set(again.payloads()), key=int) == [b"%d" % i for i in range(16)]
