"""Push consumers against a real name server and broker: delivery, retries, splitting,
broadcasting."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from evq.client.consumer import (
    ConsumeFrom,
    ConsumeResult,
    ConsumerOptions,
    MessageModel,
    PushConsumer,
)
from evq.client.errors import ClientError
from evq.client.offsets import LocalOffsets
from evq.client.pull_consumer import PullConsumer
from evq.domain.message import Message, Prop
from evq.domain.queues import MessageQueue
from evq.domain.record import offset_msg_id
from tests.client.conftest import Served
from tests.client.inbox import Inbox, produce
from tests.processes import Running, running_broker, running_namesrv

FAST = ConsumerOptions(rebalance_s=0.5, retry_delay_level=1, consume_from=ConsumeFrom.FIRST_OFFSET)


async def test_round_trip_with_tag_filter_and_committed_offsets(cluster: Served) -> None:
    await produce(cluster.namesrv, "P1", [b"%d" % i for i in range(10)])
    await produce(cluster.namesrv, "P1", [b"other"], tags="b")
    inbox = Inbox()
    c = PushConsumer("G1", cluster.namesrv, listener=inbox, options=FAST)
    c.subscribe("P1", "a || c")
    async with c:
        await inbox.until(10)
        assert sorted(inbox.payloads()) == sorted(b"%d" % i for i in range(10))
        assert all(m.topic == "P1" and m.tags == "a" for m in inbox.got)
        queues = {q for q in c.assigned if q.topic == "P1"}
    assert len(queues) == 4
    async with PullConsumer("G1", cluster.namesrv) as pc:
        # every queue committed past what it held (the filtered message included)
        assert sum([await pc.committed(q) for q in queues]) == 11


async def test_a_failed_message_comes_back_with_reconsume_1(cluster: Served) -> None:
    await produce(cluster.namesrv, "P2", [b"ok", b"fails once"])
    inbox = Inbox(fail_first={b"fails once"})
    c = PushConsumer("G2", cluster.namesrv, listener=inbox, options=FAST)
    c.subscribe("P2")
    async with c:
        await inbox.until(3)
    again = [m for m in inbox.got if m.payload() == b"fails once"]
    assert [m.reconsume_times for m in again] == [0, 1]
    assert again[1].topic == "P2"  # restored from %RETRY%G2
    assert again[0].uniq_key == again[1].uniq_key


async def test_two_members_split_the_queues_on_notification(cluster: Served) -> None:
    await produce(cluster.namesrv, "P3", [b"first"])
    a, b = Inbox(), Inbox()
    slow = attrs.evolve(FAST, rebalance_s=600)  # only NOTIFY_CONSUMER_IDS_CHANGED rebalances
    ca = PushConsumer("G3", cluster.namesrv, listener=a, options=slow, client_id="cid-a")
    cb = PushConsumer("G3", cluster.namesrv, listener=b, options=slow, client_id="cid-b")
    for c in (ca, cb):
        c.subscribe("P3")

    def owned(c: PushConsumer) -> set[MessageQueue]:
        return {q for q in c.assigned if q.topic == "P3"}

    async with ca:
        assert len(owned(ca)) == 4
        async with cb:
            async with asyncio.timeout(20):
                while len(owned(ca)) != 2:
                    await asyncio.sleep(0.05)
            split_a, split_b = owned(ca), owned(cb)
            assert len(split_b) == 2 and not split_a & split_b
            await produce(cluster.namesrv, "P3", [b"%d" % i for i in range(20)])
            async with asyncio.timeout(20):
                while len(a.got) + len(b.got) < 21:
                    await asyncio.sleep(0.05)
    assert sorted(a.payloads() + b.payloads()) == sorted(
        [b"first", *(b"%d" % i for i in range(20))])
    assert {m.queue_id for m in a.got if m.payload() != b"first"} <= {q.queue_id for q in split_a}
    assert {m.queue_id for m in b.got} <= {q.queue_id for q in split_b}


async def test_broadcasting_keeps_offsets_in_a_local_file(cluster: Served, tmp_path: Path) -> None:
    await produce(cluster.namesrv, "P4", [b"%d" % i for i in range(6)])
    inboxes = [Inbox(), Inbox()]
    consumers = [PushConsumer("G4", cluster.namesrv, model=MessageModel.BROADCASTING,
                              listener=inbox, options=FAST, offsets_file=tmp_path / f"{i}.json")
                 for i, inbox in enumerate(inboxes)]
    for c in consumers:
        c.subscribe("P4")
    async with consumers[0], consumers[1]:
        for inbox in inboxes:
            await inbox.until(6)
    for inbox in inboxes:
        assert sorted(inbox.payloads()) == sorted(b"%d" % i for i in range(6))
    table = json.loads((tmp_path / "0.json").read_text())["offsetTable"]
    assert sum(table.values()) == 6 and all(k.startswith("P4@") for k in table)


async def test_broadcasting_consumers_on_one_host_keep_separate_offsets(
        cluster: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    await produce(cluster.namesrv, "P7", [b"%d" % i for i in range(6)])
    inboxes = [Inbox(), Inbox()]
    consumers = [PushConsumer("G7", cluster.namesrv, model=MessageModel.BROADCASTING,
                              listener=inbox, options=FAST) for inbox in inboxes]
    for c in consumers:
        c.subscribe("P7")
    async with consumers[0]:
        await inboxes[0].until(6)
    async with consumers[1]:  # starts where only its own file says, not where [0] stopped
        await inboxes[1].until(6)
    files = sorted((tmp_path / ".evq" / "offsets").glob("*/G7/offsets.json"))
    assert [f.parent.parent.name for f in files] == sorted(c.client_id for c in consumers)
    for f in files:
        assert sum(json.loads(f.read_text())["offsetTable"].values()) == 6


async def test_start_needs_a_subscription_and_a_listener(cluster: Served) -> None:
    with pytest.raises(ClientError):
        await PushConsumer("G5", cluster.namesrv, listener=Inbox()).start()


def test_an_unreadable_offsets_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "offsets.json"
    bad.write_text('{"offsetTable": [1]}')
    with pytest.raises(ClientError, match="unreadable offsets file"):
        LocalOffsets(bad)


@attrs.frozen
class TwoBrokers:
    namesrv: str
    a: Running
    """Broker A, holding topic P6 (the only topic sent to before B started)."""


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[TwoBrokers]:
    with contextlib.ExitStack() as stack:
        namesrv = stack.enter_context(running_namesrv())
        a = stack.enter_context(running_broker(namesrv, tmp_path / "a", "--broker-name", "A"))
        asyncio.run(produce(namesrv, "P6", [b"fails once"]))
        stack.enter_context(running_broker(namesrv, tmp_path / "b", "--broker-name", "B"))
        yield TwoBrokers(namesrv, a)


async def test_a_send_back_its_broker_cannot_take_goes_to_the_retry_topic(
        two_brokers: TwoBrokers) -> None:
    """The message's broker dies while the listener holds it: CONSUMER_SEND_MSG_BACK has no
    one to go to, so the consumer sends the copy to %RETRY%<group> on the other broker."""
    holding, answer = asyncio.Event(), asyncio.Event()
    got: list[Message] = []

    async def listener(msgs: list[Message]) -> ConsumeResult:
        got.extend(msgs)
        if len(got) > 1:
            return ConsumeResult.CONSUME_SUCCESS
        holding.set()
        await answer.wait()
        return ConsumeResult.RECONSUME_LATER

    c = PushConsumer("G6", two_brokers.namesrv, listener=listener,
                     options=attrs.evolve(FAST, route_refresh_s=0.5))
    c.subscribe("P6")
    async with c:
        await asyncio.wait_for(holding.wait(), 20)
        two_brokers.a.proc.kill()
        await asyncio.to_thread(two_brokers.a.proc.wait, 10)
        answer.set()
        async with asyncio.timeout(30):
            while len(got) < 2:
                await asyncio.sleep(0.05)
    assert [m.reconsume_times for m in got] == [0, 1]
    assert got[1].topic == "P6" and got[1].uniq_key == got[0].uniq_key
    assert got[1].payload() == b"fails once"
    assert got[1].properties[Prop.ORIGIN_MESSAGE_ID] == offset_msg_id(
        got[0].store_host, got[0].commit_log_offset)
