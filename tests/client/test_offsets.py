"""Reading a ResetOffsetBody in both forms a broker writes (hypothesis round trips), and a
group's offsets reaching a live broker of the group when the first one asked is dead."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.client.broker_choice import BrokerChoice
from evq.client.errors import ClientError
from evq.client.offsets import RemoteOffsets, reset_notice, reset_offsets
from evq.client.routes import BrokerPool
from evq.domain.queues import MessageQueue
from evq.net import fastjson
from evq.net.codes import RequestCode
from evq.net.headers.admin import ResetOffsetRequest
from evq.net.protocol import RemotingCommand
from tests.client.conftest import Served
from tests.processes import free_port
from tests.strategies import message_queues

tables = st.dictionaries(message_queues(), st.integers(0, 2**63 - 1), max_size=12)


@given(tables)
def test_the_java_form_round_trips(table: dict[MessageQueue, int]) -> None:
    assert reset_offsets(fastjson.dumps({"offsetTable": table}).encode()) == table


@given(tables)
def test_the_cpp_array_form_round_trips(table: dict[MessageQueue, int]) -> None:
    body = json.dumps({"offsetTable": [
        {"brokerName": q.broker_name, "offset": o, "queueId": q.queue_id, "topic": q.topic}
        for q, o in table.items()]}).encode()
    assert reset_offsets(body) == table


@pytest.mark.parametrize("body", [b"", b"{}", b"[1]", b'{"offsetTable": [{"topic": 1}]}',
                                  b"\xff", b'{"offsetTable": 5}'])
def test_a_bad_body_is_a_client_error(body: bytes) -> None:
    with pytest.raises(ClientError, match="unreadable offset reset"):
        reset_offsets(body)


def test_a_notice_for_another_group_or_unreadable_sets_nothing() -> None:
    q = MessageQueue("T", "b", 1)
    body = fastjson.dumps({"offsetTable": {q: 7}}).encode()

    def notice(fields: dict[str, object], body: bytes) -> RemotingCommand:
        return RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, fields, body)

    def reset_of(group: str) -> dict[str, str]:
        return ResetOffsetRequest.write(topic="T", group=group, timestamp=0)

    assert reset_notice(notice(reset_of("G"), body), "G") == {q: 7}
    assert reset_notice(notice(reset_of("other"), body), "G") == {}
    assert reset_notice(notice({"topic": "T", "timestamp": "0"}, body), "G") == {}
    assert reset_notice(notice(reset_of("G"), b"not json"), "G") == {}


async def test_a_commit_the_dead_master_refuses_goes_to_the_live_slave(cluster: Served) -> None:
    """The master's port is closed (nothing listens), the "slave" is the real broker: the first
    commit's connection failure marks the master down and the commit is made on the slave."""
    group = {0: f"127.0.0.1:{free_port()}", 1: cluster.broker}
    choice = BrokerChoice()
    pool = BrokerPool()
    queue = MessageQueue("OffsetsFailover", "broker-x", 0)
    offsets = RemoteOffsets("G-failover", pool, lambda name: choice.offset_target(group),
                            choice.failed)
    try:
        offsets.update(queue, 7)
        await offsets.persist([queue])
        assert choice.offset_target(group) == cluster.broker
        assert await RemoteOffsets("G-failover", pool, lambda name: cluster.broker).read(queue) == 7
    finally:
        await pool.close()
