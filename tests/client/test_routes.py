"""Route parsing and the queue lists producers and consumers derive from it (§5.1)."""

from __future__ import annotations

import json

import pytest

from evq.client.errors import ClientError
from evq.client.routes import TopicRoute, parse_addresses
from evq.domain.queues import MessageQueue
from evq.domain.topics import TopicConfig
from evq.net.routes import QueueData, RouteTable

# fastjson's default output: unquoted integer keys in brokerAddrs.
JAVA_ROUTE = (b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},'
              b'"brokerName":"b","cluster":"C"},{"brokerAddrs":{1:"10.0.0.3:10911"},'
              b'"brokerName":"noMaster","cluster":"C"}],"filterServerTable":{},'
              b'"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":3,"topicSysFlag":0,'
              b'"writeQueueNums":2},{"brokerName":"noMaster","perm":6,"readQueueNums":1,'
              b'"topicSysFlag":0,"writeQueueNums":1}]}')


def test_java_route_publish_and_subscribe_lists() -> None:
    r = TopicRoute.from_body("T", JAVA_ROUTE)
    assert r.master("b") == "10.0.0.1:10911" and r.master("noMaster") is None
    assert r.publish_queues() == [MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)]
    assert r.subscribe_queues() == [MessageQueue("T", "b", i) for i in range(3)] + [
        MessageQueue("T", "noMaster", 0)]


def test_default_topic_route_is_capped_at_four() -> None:
    body = (b'{"brokerDatas":[{"brokerAddrs":{"0":"1.2.3.4:1"},"brokerName":"b",'
            b'"cluster":"C"}],"queueDatas":[{"brokerName":"b","perm":7,"readQueueNums":8,'
            b'"writeQueueNums":8}]}')
    lent = TopicRoute.from_body("TBW102", body).as_default_for("New")
    assert lent.publish_queues() == [MessageQueue("New", "b", i) for i in range(4)]


def test_order_topic_conf_wins() -> None:
    r = TopicRoute("T", {"a": {0: "x:1"}}, (), "a:2;b:1")
    assert r.publish_queues() == [MessageQueue("T", "a", 0), MessageQueue("T", "a", 1),
                                  MessageQueue("T", "b", 0)]


@pytest.mark.parametrize("body", [b"", b"[]", b'{"brokerDatas":[{"brokerName":"b"}]}', b"\xff"])
def test_unreadable_route_is_a_client_error(body: bytes) -> None:
    with pytest.raises(ClientError, match="unreadable route"):
        TopicRoute.from_body("T", body)


def test_a_name_server_route_reads_back_as_the_same_queue_data() -> None:
    """Client and name server share one QueueData: what the table answers, the client
    reads back whole, the topic's system flag included."""
    table = RouteTable()
    topics = [TopicConfig(topic_name="T", read_queue_nums=3, write_queue_nums=2, perm=6,
                          topic_sys_flag=1)]
    table.register(cluster="C", broker_name="b", broker_addr="10.0.0.1:10911", broker_id=0,
                   ha_server_addr="", topics=topics, now_ms=0)
    answer = table.route("T")
    assert answer is not None
    route = TopicRoute.from_body("T", json.dumps(answer).encode())
    assert route.queue_datas == tuple(table.queues("T").values())
    assert route.queue_datas == (QueueData("b", 3, 2, 6, 1),)


def test_name_server_addresses() -> None:
    assert parse_addresses("a:1; b:2;") == [("a", 1), ("b", 2)]
    for bad in ("", "a", "a:x", ":1"):
        with pytest.raises(ValueError):
            parse_addresses(bad)
