"""Producer and pull consumer against a real name server and broker: sends of every kind read
back."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evq.admin.operations import Admin
from evq.client.errors import BrokerRefused, ClientError, NotStarted, SendFailed
from evq.client.producer import Producer, SendStatus, delayed, deliver_at, order_queue
from evq.client.pull_consumer import PullConsumer
from evq.client.pulling import PullStatus
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.codes import ResponseCode
from evq.domain.hashing import java_hash
from evq.domain.message import Message, Prop, new_message
from evq.domain.queues import MessageQueue
from evq.net.transport import TransportError
from tests.client.clocks import SlowAnswers
from tests.client.conftest import Served
from tests.client.inbox import routed_queues
from tests.processes import running_broker, running_namesrv


async def read_all(namesrv: str, topic: str, group: str = "G-read") -> list[Message]:
    async with PullConsumer(group, namesrv) as c:
        out: list[Message] = []
        for q in await routed_queues(c, topic):
            r = await c.pull(q, 0, 64)
            out += r.messages
        return out


async def test_send_round_trip_with_tags_keys_properties_and_compression(cluster: Served) -> None:
    big = b"x" * 5000
    async with Producer("PG", cluster.namesrv) as p:
        small = await p.send(new_message("RT", b"hello", tags="a", keys=["k1", "k2"],
                                         properties={"p": "v"}))
        large = await p.send(new_message("RT", big))
    assert small.status is SendStatus.SEND_OK and len(small.msg_id) == 32
    got = {m.uniq_key: m for m in await read_all(cluster.namesrv, "RT")}
    m = got[small.msg_id]
    assert (m.payload(), m.tags, m.keys, m.properties["p"]) == (b"hello", "a", ["k1", "k2"], "v")
    assert m.queue_id == small.queue.queue_id and m.queue_offset == small.queue_offset
    stored_big = got[large.msg_id]
    assert stored_big.sysflag & sf.COMPRESSED and zlib.decompress(stored_big.body) == big


async def test_batch_and_oneway(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv) as p:
        r = await p.send_batch([new_message("B", b"m%d" % i, tags="t") for i in range(5)])
        await p.send_oneway(new_message("B", b"oneway"))
        await p.send(new_message("B", b"after"))  # same connection: the oneway is stored first
        with pytest.raises(ClientError):
            await p.send_batch([new_message("B", b""), new_message("Other", b"")])
    ids = r.msg_id.split(",")
    assert len(ids) == 5 and len(r.offset_msg_id.split(",")) == 5
    got = await read_all(cluster.namesrv, "B")
    batch = sorted((m for m in got if m.uniq_key in ids), key=lambda m: m.queue_offset)
    assert [m.payload() for m in batch] == [b"m%d" % i for i in range(5)]
    assert {m.queue_id for m in batch} == {r.queue.queue_id}
    assert b"oneway" in {m.payload() for m in got}


async def test_a_batch_keeps_the_keys_its_caller_chose_and_gives_the_others_fresh_ones(
        cluster: Served) -> None:
    chosen = "0A0B0C0D" + "0" * 24
    msgs = [new_message("BK", b"a"), new_message("BK", b"b"), new_message("BK", b"c")]
    msgs[1].properties[Prop.UNIQ_KEY] = chosen
    async with Producer("PG", cluster.namesrv) as p:
        r = await p.send_batch(msgs)
    ids = r.msg_id.split(",")
    assert ids[1] == chosen and len(set(ids)) == 3
    assert all(len(key) == 32 and key[:28] == ids[0][:28] for key in (ids[0], ids[2]))
    stored = {m.uniq_key: m.payload() for m in await read_all(cluster.namesrv, "BK")}
    assert [stored[key] for key in ids] == [b"a", b"b", b"c"]


async def test_a_batch_mixing_compressed_and_plain_messages_reads_back(cluster: Served) -> None:
    """A batch goes out uncompressed: a message ``new_message`` compressed is inflated into
    it, the others are sent as they are."""
    big = b"y" * 5000
    msgs = [new_message("BZ", b"small"), new_message("BZ", big), new_message("BZ", b"tail")]
    assert [m.sysflag & sf.COMPRESSED for m in msgs] == [0, sf.COMPRESSED, 0]
    async with Producer("PG", cluster.namesrv) as p:
        r = await p.send_batch(msgs)
    ids = r.msg_id.split(",")
    got = sorted((m for m in await read_all(cluster.namesrv, "BZ") if m.uniq_key in ids),
                 key=lambda m: m.queue_offset)
    assert [m.payload() for m in got] == [b"small", big, b"tail"]


async def test_orderly_by_key_uses_the_java_hash(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv) as p:
        await p.send(new_message("O", b"create"))
        queues = await p.publish_queues("O")
        results = [await p.send_orderly(new_message("O", b"%d" % i), f"order-{i % 3}")
                   for i in range(9)]
    for i, r in enumerate(results):
        assert r.queue == queues[abs(java_hash(f"order-{i % 3}")) % len(queues)]
    stored = sorted(await read_all(cluster.namesrv, "O"), key=lambda m: m.queue_offset)
    for k in range(3):
        mine = {b"%d" % i for i in range(k, 9, 3)}
        in_queue = [m.payload() for m in stored
                    if m.queue_id == results[k].queue.queue_id and m.payload() in mine]
        assert in_queue == sorted(mine)


async def test_orderly_sends_take_the_queue_a_custom_selector_picks(cluster: Served) -> None:
    def last_digit(queues: Sequence[MessageQueue], msg: Message, key: str) -> MessageQueue:
        return queues[int(key[-1]) % len(queues)]

    async with Producer("PG", cluster.namesrv) as p:
        await p.send(new_message("OS", b"create"))
        results = [await p.send_orderly(new_message("OS", b"%d" % i), f"k{i}", last_digit)
                   for i in range(8)]
        with pytest.raises(ClientError, match="not a publish queue"):
            await p.send_orderly(new_message("OS", b"x"), "k",
                                 lambda qs, m, k: MessageQueue("OS", "nowhere", 0))
    assert [r.queue.queue_id for r in results] == [i % 4 for i in range(8)]
    stored = await read_all(cluster.namesrv, "OS")
    assert {(m.queue_id, m.payload()) for m in stored if m.payload() != b"create"} == {
        (i % 4, b"%d" % i) for i in range(8)}


def test_order_queue_handles_negative_hashes() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(3)]
    key = "polygenelubricants"  # Java hash is Integer.MIN_VALUE
    assert java_hash(key) == -(2**31)
    assert order_queue(queues, key) == queues[2**31 % 3]


async def test_delay_properties_are_sent(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv) as p:
        await p.send(new_message("D", b"now"))
        await p.send(delayed(new_message("D", b"later"), 1))
        deliver_at(new_message("D", b"x"), 1)  # only sets the property
    async with PullConsumer("G-delay", cluster.namesrv) as c:
        queues = await routed_queues(c, "D")
        await c.assign(queues)
        seen: list[Message] = []
        for _ in range(40):
            for q in queues:
                seen += (await c.poll(q, wait_ms=500)).messages
            if any(m.payload() == b"later" for m in seen):
                break
    later = next(m for m in seen if m.payload() == b"later")
    assert later.properties[Prop.REAL_TOPIC] == "D"  # it went through the schedule topic
    assert later.store_timestamp - later.born_timestamp >= 900


async def test_a_deliver_at_message_is_delivered_at_its_time(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv) as p:
        await p.send(new_message("DA", b"create"))
        when = time.time_ns() // 1_000_000 + 2000
        await p.send(deliver_at(new_message("DA", b"at"), when))
    got: list[Message] = []
    async with PullConsumer("G-da", cluster.namesrv) as c:
        queues = await routed_queues(c, "DA")
        await c.assign(queues)
        async with asyncio.timeout(15):
            while not any(m.payload() == b"at" for m in got):
                got += await c.poll_all(wait_ms=500)
                if time.time_ns() // 1_000_000 < when - 100:  # early: nothing but "create"
                    assert [m.payload() for m in got] in ([], [b"create"])
    arrived = time.time_ns() // 1_000_000
    at = next(m for m in got if m.payload() == b"at")
    assert when <= at.store_timestamp <= arrived
    assert Prop.START_DELIVER_TIME not in at.properties


async def test_pull_consumer_commit_and_seek(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv) as p:
        for i in range(4):
            await p.send_orderly(new_message("PC", b"%d" % i), "k")
    async with PullConsumer("G-pc", cluster.namesrv) as c:
        q = order_queue(await routed_queues(c, "PC"), "k")
        assert await c.committed(q) in (-1, 0)
        await c.assign([q])
        r = await c.poll(q, 2)
        assert [m.payload() for m in r.messages] == [b"0", b"1"]
        await c.commit()
        c.seek(q, 3)
        assert [m.payload() for m in (await c.poll(q)).messages] == [b"3"]
        assert (await c.poll(q)).status is PullStatus.NO_NEW_MSG
        assert await c.committed(q) == 2
        await c.seek_to_end(q)
        assert c.assignment[q] == 4


async def test_unstarted_producer_refuses() -> None:
    with pytest.raises(NotStarted):
        await Producer("PG", "127.0.0.1:1").send(new_message("T", b""))


async def test_a_dead_broker_fails_the_send_and_is_avoided(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv, retries=1, send_timeout=1.0) as p:
        r = await p.send(new_message("Dead", b"before"))
        cluster.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(cluster.proc.wait, 30) == 0
        with pytest.raises(SendFailed, match="2 times"):
            await p.send(new_message("Dead", b"after"))
        assert not p.faults.is_available(r.queue.broker_name)


async def test_the_fault_table_records_a_sends_latency(cluster: Served) -> None:
    clock = SlowAnswers()
    async with Producer("PG", cluster.namesrv, clock=clock) as p:
        fast = await p.send(new_message("Slow", b"fast"))
        assert p.faults.is_available(fast.queue.broker_name)
        clock.slow = True
        slow = await p.send(new_message("Slow", b"slow"))
        clock.slow = False
        assert not p.faults.is_available(slow.queue.broker_name)  # skipped for 30 s
        # The only broker is still the one a send goes to.
        assert (await p.send(new_message("Slow", b"after"))).status is SendStatus.SEND_OK


# --- the send coroutine's paths that are not the healthy send, on real brokers ------------


async def test_a_failed_heartbeat_is_retried_elsewhere_without_touching_the_fault_table(
    tmp_path: Path,
) -> None:
    """A broker that came up after the producer started (so was never greeted) dies while the
    producer still holds its route: the heartbeat before the first send to it fails each time
    and is retried, and no latency is reported (a heartbeat is no send)."""
    with running_namesrv() as namesrv, contextlib.ExitStack() as stack:
        async with Producer("PG", namesrv, retries=2, send_timeout=1.0) as p:
            # (in a thread: it waits for the registration with a loop of its own)
            broker = await asyncio.to_thread(
                stack.enter_context, running_broker(namesrv, tmp_path / "data"))
            assert await p.publish_queues("Greet")  # routed, as a send would be: not greeted
            broker.proc.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(broker.proc.wait, 30) == -signal.SIGKILL
            with capture_logs() as logs, pytest.raises(SendFailed, match="3 times"):
                await p.send(new_message("Greet", b"x"))  # on the route it knows
    assert [e["attempt"] for e in logs if e["event"] == "send failed"] == [0, 1, 2]
    assert p.faults.least_bad() is None


async def test_a_chosen_queue_fails_once_and_as_it_is(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv, retries=2, send_timeout=1.0) as p:
        await p.send_to_queue(new_message("Chosen", b"before"), 0)
        cluster.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(cluster.proc.wait, 30) == 0
        with capture_logs() as logs, pytest.raises(TransportError):
            await p.send_to_queue(new_message("Chosen", b"after"), 0)
    assert [e for e in logs if e["event"] == "send failed"] == []


async def test_a_refusal_that_is_not_retried_fails_the_send_at_once(tmp_path: Path) -> None:
    """MESSAGE_ILLEGAL (a body past the broker's maxMessageSize) is the message's fault, not
    the broker's: no other broker is tried."""
    conf = tmp_path / "broker.conf"
    conf.write_text("maxMessageSize=1024\n")
    with running_namesrv() as namesrv, contextlib.ExitStack() as stack:
        broker = await asyncio.to_thread(
            stack.enter_context, running_broker(namesrv, tmp_path / "data", "--config", str(conf)))
        async with Producer("PG", namesrv, retries=2) as p:
            with capture_logs() as logs, pytest.raises(BrokerRefused) as refused:
                await p.send(new_message("Big", bytes(2048)))  # (not compressed)
            assert (await p.send(new_message("Big", bytes(1024)))).status is SendStatus.SEND_OK
        assert broker.stop() == 0
    assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert [e for e in logs if e["event"] == "send failed"] == []


async def test_a_topic_without_a_writable_queue_fails_the_send(cluster: Served) -> None:
    async with Producer("PG", cluster.namesrv, route_refresh_s=0.2) as p:
        await p.send(new_message("ReadOnly", b"x"))
        async with Admin(cluster.namesrv) as admin:
            await admin.update_topic(tp.TopicConfig(topic_name="ReadOnly", perm=4),
                                     broker=cluster.broker)
        async with asyncio.timeout(10):  # until the broker's registration reaches the producer
            while await p.publish_queues("ReadOnly"):
                await asyncio.sleep(0.05)
        with pytest.raises(SendFailed, match="no writable queue"):
            await p.send(new_message("ReadOnly", b"y"))
