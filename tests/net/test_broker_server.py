"""The broker server over real sockets: the requests stock clients make, answered as they
expect (every header value a string, RocketMQ's codes and remarks)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

from evq.domain.codes import ResponseCode
from evq.domain.log import FlushMode
from evq.domain.message import Prop, encode_properties, new_message
from evq.domain.record import encode_batch, iter_records
from evq.net.broker.stats import BrokerStats
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import RemotingClient
from tests.net.harness import broker

TIMEOUT = 5.0


async def call(client: RemotingClient, code: int, fields: dict[str, object] | None = None,
               body: bytes = b"") -> RemotingCommand:
    return await client.invoke(RemotingCommand.request(code, fields, body), TIMEOUT)


def send_fields(topic: str, queue_id: int = 0, **props: str) -> dict[str, object]:
    return {"producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4, "queueId": queue_id, "sysFlag": 0,
            "bornTimestamp": 1700000000000, "flag": 0,
            "properties": encode_properties(props), "reconsumeTimes": 0, "unitMode": "0"}


async def test_send_then_pull_with_every_header_a_string(tmp_path: Path) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        r = await call(c, RequestCode.SEND_MESSAGE, send_fields("T", 1, TAGS="a", KEYS="k"),
                       b"hello")
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert set(r.ext_fields) >= {"msgId", "queueId", "queueOffset"}
        assert (r.ext_fields["queueId"], r.ext_fields["queueOffset"]) == ("1", "0")
        assert r.ext_fields["msgId"].startswith("7F000001")  # the real store host
        p = await call(c, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "G", "topic": "T", "queueId": 1, "queueOffset": 0,
            "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "a || b", "subVersion": 0})
        assert p.code == ResponseCode.SUCCESS and p.remark == "FOUND"
        assert p.ext_fields["nextBeginOffset"] == "1"
        (m,) = list(iter_records(p.body))
        assert (m.body, m.tags, m.born_host[0]) == (b"hello", "a", "127.0.0.1")
        table = json.loads((await call(c, RequestCode.GET_BROKER_RUNTIME_INFO)).body)["table"]
        assert (table["msgPutTotalTodayNow"], table["msgGetTotalTodayNow"]) == ("1", "1")
        assert int(table["putMessageSizeTotal"]) > len(b"hello")  # the whole stored record
        for key in ("putTps", "getTransferedTps", "getFoundTps", "getMissTps", "getTotalTps"):
            assert re.fullmatch(r"\d+\.\d\d \d+\.\d\d \d+\.\d\d", table[key]), (key, table[key])


def test_rates_over_rocketmqs_three_windows() -> None:
    stats = BrokerStats(boot_ms=0)
    assert stats.runtime_fields(0)["putTps"] == "0.00 0.00 0.00"  # nothing sampled yet
    for second in range(0, 601):
        stats.messages_put += 5 if second <= 590 else 50  # a burst in the last ten seconds
        stats.pulls_missed += 1
        stats.sample(second * 1000)
    fields = stats.runtime_fields(601_000)
    assert fields["putTps"] == "50.00 12.50 5.75"  # 10 s, 60 s and 600 s back
    assert fields["getMissTps"] == fields["getTotalTps"] == "1.00 1.00 1.00"
    assert fields["getFoundTps"] == "0.00 0.00 0.00"


async def test_v2_headers_batches_and_errors(tmp_path: Path) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        v2 = dict(zip("abcdefghijk", send_fields("T").values(), strict=True))
        r = await call(c, RequestCode.SEND_MESSAGE_V2, v2, b"v2")
        assert r.code == ResponseCode.SUCCESS, r.remark
        batch = encode_batch([new_message("T", b"x"), new_message("T", b"y")])
        r = await call(c, RequestCode.SEND_BATCH_MESSAGE, {**send_fields("T"), "batch": "1"},
                       batch)
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["msgId"].count(",") == 1
        r = await call(c, RequestCode.SEND_MESSAGE, send_fields("bad topic!"), b"x")
        assert r.code == ResponseCode.SYSTEM_ERROR and "illegal characters" in (r.remark or "")
        r = await call(c, RequestCode.SEND_MESSAGE, {"topic": "T"}, b"x")
        assert r.code == ResponseCode.SYSTEM_ERROR and "queueId" in (r.remark or "")
        r = await call(c, 9999)
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_long_polling_pull_is_woken_by_a_send(tmp_path: Path) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        await call(c, RequestCode.SEND_MESSAGE, send_fields("T"), b"first")
        parked = asyncio.ensure_future(call(c, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": 1,
            "maxMsgNums": 32, "sysFlag": 6, "commitOffset": 0,
            "suspendTimeoutMillis": 20000, "subscription": "*", "subVersion": 0}))
        await asyncio.sleep(0.2)
        assert not parked.done()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await call(c, RequestCode.SEND_MESSAGE, send_fields("T"), b"second")
        p = await asyncio.wait_for(parked, 5)
        assert loop.time() - t0 < 2
        assert [m.body for m in iter_records(p.body)] == [b"second"]


async def test_heartbeat_consumer_list_offsets_and_locks(tmp_path: Path) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        beat = {"clientID": "1-127.0.0.1@DEFAULT", "consumerDataSet": [{
            "groupName": "G", "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0,
            "subscriptionDataSet": [{"topic": "T", "subString": "*", "subVersion": "1"}]}],
            "producerDataSet": [{"groupName": "PG"}]}
        r = await call(c, RequestCode.HEART_BEAT, body=json.dumps(beat).encode())
        assert r.code == ResponseCode.SUCCESS
        r = await call(c, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
        assert json.loads(r.body) == {"consumerIdList": ["1-127.0.0.1@DEFAULT"]}
        q = {"consumerGroup": "G", "topic": "T", "queueId": 0}
        r = await call(c, RequestCode.QUERY_CONSUMER_OFFSET, q)
        assert (r.code, r.ext_fields["offset"]) == (ResponseCode.SUCCESS, "0")
        await call(c, RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 7})
        r = await call(c, RequestCode.QUERY_CONSUMER_OFFSET, q)
        assert r.ext_fields["offset"] == "7"
        mq = {"brokerName": "broker-a", "queueId": 0, "topic": "T"}
        lock = {"clientId": "1-127.0.0.1@DEFAULT", "consumerGroup": "G", "mqSet": [mq]}
        r = await call(c, RequestCode.LOCK_BATCH_MQ, body=json.dumps(lock).encode())
        assert json.loads(r.body) == {"lockOKMQSet": [mq]}
        other = {**lock, "clientId": "other"}
        r = await call(c, RequestCode.LOCK_BATCH_MQ, body=json.dumps(other).encode())
        assert json.loads(r.body) == {"lockOKMQSet": []}
        r = await call(c, RequestCode.HEART_BEAT, body=b"{not json")
        assert r.code == ResponseCode.SYSTEM_ERROR


async def test_queries_and_send_back(tmp_path: Path) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        r = await call(c, RequestCode.SEND_MESSAGE,
                       send_fields("T", KEYS="order-1", **{Prop.UNIQ_KEY: "U1"}), b"q")
        offset = int(r.ext_fields["msgId"][16:], 16)
        q = {"topic": "T", "queueId": 0}
        assert (await call(c, RequestCode.GET_MAX_OFFSET, q)).ext_fields["offset"] == "1"
        assert (await call(c, RequestCode.GET_MIN_OFFSET, q)).ext_fields["offset"] == "0"
        r = await call(c, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
        assert next(iter_records(r.body)).body == b"q"
        r = await call(c, RequestCode.QUERY_MESSAGE, {"topic": "T", "key": "order-1",
                                                       "maxNum": 10, "beginTimestamp": 0,
                                                       "endTimestamp": 2**62})
        assert [m.body for m in iter_records(r.body)] == [b"q"]
        r = await call(c, RequestCode.QUERY_MESSAGE, {"topic": "T", "key": "nope", "maxNum": 1,
                                                       "beginTimestamp": 0, "endTimestamp": 1})
        assert r.code == ResponseCode.QUERY_NOT_FOUND
        r = await call(c, RequestCode.CONSUMER_SEND_MSG_BACK,
                       {"offset": offset, "group": "G", "delayLevel": 0})
        assert r.code == ResponseCode.SUCCESS
        r = await call(c, RequestCode.CONSUMER_SEND_MSG_BACK,
                       {"offset": offset + 1, "group": "G", "delayLevel": 0})
        assert r.code == ResponseCode.SYSTEM_ERROR


async def test_a_full_disk_refuses_sends_and_send_backs_with_the_reason_and_serves_reads(
    tmp_path: Path,
) -> None:
    """Above the warning level (set below what any disk uses, for a disk that is full here)
    every put is answered SERVICE_NOT_AVAILABLE with the disk's use and path, a send-back
    too (it was answered SUCCESS although the store did not take the retry message), and
    pulls go on."""
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        r = await call(c, RequestCode.SEND_MESSAGE, send_fields("T"), b"kept")
        offset = int(r.ext_fields["msgId"][16:], 16)
        r = await call(c, RequestCode.CONSUMER_SEND_MSG_BACK,
                       {"offset": offset, "group": "G", "delayLevel": 0})
        assert r.code == ResponseCode.SUCCESS  # the group and its retry topic now exist
    async with broker(tmp_path, disk_space_warning_level_ratio=1e-9) as b, \
            RemotingClient("127.0.0.1", b.server.port) as c:
        r = await call(c, RequestCode.SEND_MESSAGE, send_fields("T"), b"refused")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert (r.remark or "").startswith("service not available now: disk full: ")
        assert str(tmp_path) in (r.remark or "")
        r = await call(c, RequestCode.CONSUMER_SEND_MSG_BACK,
                       {"offset": offset, "group": "G", "delayLevel": 0})
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "disk full" in (r.remark or "")
        p = await call(c, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": 0,
            "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0})
        assert [m.body for m in iter_records(p.body)] == [b"kept"]
        info = json.loads((await call(c, RequestCode.GET_BROKER_RUNTIME_INFO)).body)["table"]
        assert info["evqPutsRefused"] == "true" and "disk full" in info["evqPutsRefusedReason"]


async def test_admin_topic_and_stats(tmp_path: Path) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        r = await call(c, RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": "A", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
            "topicFilterType": "SINGLE_TAG"})
        assert r.code == ResponseCode.SUCCESS
        r = await call(c, RequestCode.GET_ALL_TOPIC_CONFIG)
        assert json.loads(r.body)["topicConfigTable"]["A"]["readQueueNums"] == 2
        r = await call(c, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "A"})
        assert r.body.count(b'"maxOffset":0') == 2
        r = await call(c, RequestCode.GET_BROKER_RUNTIME_INFO)
        table = json.loads(r.body)["table"]
        assert table["brokerVersionDesc"] == "V4_9_7"
        # The first record is the broker's own (system topics, at start-up): stored by now.
        assert 0 < int(table["earliestMessageTimeStamp"]) <= time.time() * 1000
        assert 0 < float(table["commitLogDiskRatio"]) < 1  # the data dir's disk, not 0.0
        assert (table["evqPutsRefused"], table["evqPutsRefusedReason"]) == ("false", "")
        assert table["commitLogDirCapacity"].startswith("Total : ")
        assert int(table["bootTimestamp"]) <= time.time() * 1000
        assert table["runtime"].startswith("[ 0 days, 0 hours, ")
        r = await call(c, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "A"})
        assert r.code == ResponseCode.SUCCESS
        r = await call(c, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "A"})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST


async def test_ill_shaped_bodies_and_headers_are_refused_with_a_reason(tmp_path: Path) -> None:
    async with broker(tmp_path) as b, RemotingClient("127.0.0.1", b.server.port) as c:
        r = await call(c, RequestCode.SEND_BATCH_MESSAGE, {**send_fields("T"), "batch": "1"})
        assert (r.code, r.remark) == (ResponseCode.MESSAGE_ILLEGAL, "a batch without messages")
        for body, reason in [(b'{"consumerDataSet": [{"groupName": "G"}]}', "without a client id"),
                             (b'{"clientID": "c", "consumerDataSet": [5]}', "bad heartbeat"),
                             (b"[" * 5000, "not JSON")]:
            r = await call(c, RequestCode.HEART_BEAT, body=body)
            assert r.code == ResponseCode.SYSTEM_ERROR and reason in (r.remark or "")
        assert not (await call(c, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body.count(
            b'"G"')  # a refused heartbeat created no group
        for mq_set in ('{"mqSet": 5}', '{"mqSet": [{"topic": "T", "brokerName": "b"}]}',
                       '{"mqSet": [{"topic": "T", "brokerName": "b", "queueId": 1e400}]}'):
            r = await call(c, RequestCode.LOCK_BATCH_MQ, body=mq_set.encode())
            assert r.code == ResponseCode.SYSTEM_ERROR and "bad message queue set" in (
                r.remark or "")
        r = await call(c, RequestCode.UPDATE_AND_CREATE_TOPIC,
                       {"topic": "A", "topicFilterType": "NO_TAG"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "NO_TAG" in (r.remark or "")


async def test_sync_flush_broker_acknowledges_after_the_group_commit(tmp_path: Path) -> None:
    async with broker(tmp_path, flush=FlushMode.SYNC_FLUSH) as b, \
            RemotingClient("127.0.0.1", b.server.port) as c:
        sends = [call(c, RequestCode.SEND_MESSAGE, send_fields("T"), bytes([i]))
                 for i in range(20)]
        answers = await asyncio.gather(*sends)
        assert {a.code for a in answers} == {ResponseCode.SUCCESS}
        assert b.ctx is not None
        assert b.ctx.core.log.durable_offset >= b.ctx.core.log.max_physical_offset


async def test_slave_read_rule_weighs_this_machines_memory(tmp_path: Path) -> None:
    async with broker(tmp_path) as server:
        assert server.ctx is not None
        assert server.ctx.core.config.total_memory_bytes == (
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
