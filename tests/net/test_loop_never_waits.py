"""The execution model, checked: no request makes the event loop wait on disk.

Every request that creates metadata (auto-created topics, groups, retry and DLQ topics,
admin updates, resets) is sent to a SYNC_FLUSH broker, where a metadata record waits for a
flush; the broker names any metadata write made on its loop thread
(``metadata_write_on_event_loop``), and none may appear.
"""

from __future__ import annotations

import json
from pathlib import Path

from structlog.testing import capture_logs

from evq.domain.codes import ResponseCode
from evq.domain.log import FlushMode
from evq.domain.message import encode_properties
from evq.domain.record import iter_records
from evq.net.codes import RequestCode
from evq.net.headers.admin import CreateTopicRequest, ResetOffsetRequest
from evq.net.headers.pull import FLAG_SUBSCRIPTION
from evq.net.transport import RemotingClient
from tests.net.harness import broker
from tests.net.test_broker_server import call, send_fields

LOOP_WRITE = "metadata_write_on_event_loop"


def pull_fields(group: str, topic: str) -> dict[str, object]:
    return {"consumerGroup": group, "topic": topic, "queueId": 0, "queueOffset": 0,
            "maxMsgNums": 32, "sysFlag": FLAG_SUBSCRIPTION, "commitOffset": 0,
            "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}


async def test_no_request_writes_metadata_on_the_event_loop(tmp_path: Path) -> None:
    with capture_logs() as logs:
        async with broker(tmp_path, flush=FlushMode.SYNC_FLUSH) as b, \
                RemotingClient("127.0.0.1", b.server.port) as c:
            assert b.ctx is not None
            sent = await call(c, RequestCode.SEND_MESSAGE, send_fields("AutoCreated"), b"m")
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            pulled = await call(c, RequestCode.PULL_MESSAGE, pull_fields("NewGroup", "AutoCreated"))
            assert pulled.code == ResponseCode.SUCCESS, pulled.remark
            retry = {**send_fields("%RETRY%OtherGroup"), "reconsumeTimes": 99,
                     "properties": encode_properties({"RETRY_TOPIC": "AutoCreated"})}
            r = await call(c, RequestCode.SEND_MESSAGE, retry, b"dead")  # to a new DLQ
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert b.ctx.core.topic("%DLQ%OtherGroup") is not None
            beat = {"clientID": "c1", "consumerDataSet": [{
                "groupName": "BeatGroup", "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [{"topic": "AutoCreated", "subString": "*"}]}]}
            r = await call(c, RequestCode.HEART_BEAT, body=json.dumps(beat).encode())
            assert r.code == ResponseCode.SUCCESS, r.remark
            (stored,) = iter_records(pulled.body)
            r = await call(c, RequestCode.CONSUMER_SEND_MSG_BACK, {
                "group": "BackGroup", "offset": stored.commit_log_offset, "delayLevel": 0,
                "originMsgId": "x", "originTopic": "AutoCreated"})
            assert r.code == ResponseCode.SUCCESS, r.remark
            r = await call(c, RequestCode.UPDATE_AND_CREATE_TOPIC, CreateTopicRequest.write(
                topic="AdminTopic", read_queue_nums=2, write_queue_nums=2))
            assert r.code == ResponseCode.SUCCESS, r.remark
            r = await call(c, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                           body=json.dumps({"groupName": "AdminGroup"}).encode())
            assert r.code == ResponseCode.SUCCESS, r.remark
            r = await call(c, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ResetOffsetRequest.write(
                topic="AutoCreated", group="NewGroup", timestamp=0))
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert b.ctx.loop_lag.ticks > 0
    assert [e for e in logs if e["event"] == LOOP_WRITE] == []


async def test_a_metadata_write_on_the_loop_is_named(tmp_path: Path) -> None:
    """The check itself: a write the shell wrongly makes on its loop is logged."""
    async with broker(tmp_path) as b:
        assert b.ctx is not None
        with capture_logs() as logs:
            b.ctx.core.ensure_topic("MadeOnTheLoop")
    assert [e["events"] for e in logs if e["event"] == LOOP_WRITE] == [["topic.put"]]
