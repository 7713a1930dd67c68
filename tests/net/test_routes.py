"""The name server's route tables: registration, routes, slaves, expiry, KV."""

from __future__ import annotations

import gc

import attrs

from evq.domain.topics import PERM_RW, TopicConfig
from evq.net.register_broker import DataVersion
from evq.net.routes import ORDER_TOPIC_CONFIG, Registrant, RouteTable, queue_table

T = [TopicConfig(topic_name="T", read_queue_nums=4, write_queue_nums=2)]


def register(rt: RouteTable, name: str = "broker-a", broker_id: int = 0, port: int = 10911,
             now: int = 0, topics: list[TopicConfig] = T) -> object:
    return rt.register(cluster="C", broker_name=name, broker_addr=f"127.0.0.1:{port}",
                       broker_id=broker_id, ha_server_addr=f"127.0.0.1:{port + 1}",
                       topics=topics, now_ms=now)


def test_route_has_the_shape_clients_parse() -> None:
    rt = RouteTable()
    register(rt)
    register(rt, "broker-b", port=20911)
    route = rt.route("T")
    assert route == {
        "brokerDatas": [
            {"brokerAddrs": {"0": "127.0.0.1:10911"}, "brokerName": "broker-a", "cluster": "C"},
            {"brokerAddrs": {"0": "127.0.0.1:20911"}, "brokerName": "broker-b", "cluster": "C"},
        ],
        "filterServerTable": {},
        "queueDatas": [
            {"brokerName": n, "perm": PERM_RW, "readQueueNums": 4, "topicSysFlag": 0,
             "writeQueueNums": 2} for n in ("broker-a", "broker-b")
        ],
    }
    assert rt.route("NOPE") is None
    assert rt.topic_list() == ["T"]


def test_slaves_learn_their_master_and_only_masters_set_queues() -> None:
    rt = RouteTable()
    reg = register(rt, broker_id=1, port=10921,
                   topics=[TopicConfig(topic_name="ONLY_SLAVE")])
    assert reg.master_addr is None  # type: ignore[attr-defined]
    register(rt)
    reg = register(rt, broker_id=1, port=10921)
    assert (reg.master_addr, reg.ha_server_addr) == (  # type: ignore[attr-defined]
        "127.0.0.1:10911", "127.0.0.1:10912")
    assert rt.route("ONLY_SLAVE") is None
    route = rt.route("T")
    assert route is not None
    assert route["brokerDatas"][0]["brokerAddrs"] == {  # type: ignore[index]
        "0": "127.0.0.1:10911", "1": "127.0.0.1:10921"}


def test_silent_brokers_expire_with_their_topics_and_cluster() -> None:
    rt = RouteTable()
    register(rt, now=0)
    register(rt, "broker-b", port=20911, now=100_000)
    assert rt.expire(now_ms=120_000) == []
    assert rt.expire(now_ms=120_001) == ["127.0.0.1:10911"]
    route = rt.route("T")
    assert route is not None and [b["brokerName"] for b in route["brokerDatas"]] == ["broker-b"]  # type: ignore[attr-defined]
    rt.expire(now_ms=300_000)
    assert rt.route("T") is None and rt.cluster_info() == {"brokerAddrTable": {},
                                                            "clusterAddrTable": {}}


def test_unregister_and_closed_channels() -> None:
    rt = RouteTable()
    channel = object()
    rt.register(cluster="C", broker_name="a", broker_addr="h:1", broker_id=0,
                ha_server_addr="h:2", topics=T, now_ms=0, channel=channel)
    register(rt, "b", port=5)
    rt.unregister(cluster="C", broker_name="b", broker_addr="127.0.0.1:5", broker_id=0)
    assert rt.channel_closed(channel) == ["h:1"]
    assert rt.route("T") is None


def test_order_topic_conf_comes_from_kv() -> None:
    rt = RouteTable()
    register(rt)
    rt.put_kv(ORDER_TOPIC_CONFIG, "T", "broker-a:2")
    assert rt.route("T")["orderTopicConf"] == "broker-a:2"  # type: ignore[index]
    assert rt.get_kv(ORDER_TOPIC_CONFIG, "T") == "broker-a:2"
    rt.delete_kv(ORDER_TOPIC_CONFIG, "T")
    assert "orderTopicConf" not in rt.route("T")  # type: ignore[operator]


def test_delete_topic_per_cluster() -> None:
    rt = RouteTable()
    register(rt)
    rt.delete_topic("T", "OTHER")
    assert rt.route("T") is not None
    rt.delete_topic("T", "C")
    assert rt.route("T") is None


def test_topics_by_cluster() -> None:
    rt = RouteTable()
    register(rt)
    rt.register(cluster="D", broker_name="broker-d", broker_addr="127.0.0.1:30911", broker_id=0,
                ha_server_addr="", topics=[TopicConfig(topic_name="U")], now_ms=0)
    assert rt.topics_by_cluster("C") == ["T"]
    assert rt.topics_by_cluster("D") == ["U"]
    assert rt.topics_by_cluster("NONE") == []


def test_a_table_without_a_version_is_applied_at_every_registration() -> None:
    """Only a version the address had applied makes a registration a heartbeat."""
    rt = RouteTable()
    register(rt)
    rt.delete_topic("T")
    register(rt)
    assert rt.route("T") is not None and (rt.applied, rt.heartbeats) == (2, 0)


def test_a_broker_leaves_a_shared_topic_in_one_step_and_the_index_stays_untracked() -> None:
    """A topic's entry of brokers is changed in place when one leaves, whatever the number
    serving it (rebuilt without it, as a tuple was, one connection's 4,096 brokers sharing
    244 topics took minutes of the loop to drop), and holds nothing the cycle collector
    tracks (a million topics must not lengthen its full collections)."""
    rt = RouteTable()
    for b in range(3):
        rt.register(cluster="C", broker_name=f"b{b}", broker_addr=f"10.0.0.{b}:10911",
                    broker_id=0, ha_server_addr="", topics=[TopicConfig(topic_name="T")],
                    now_ms=0, channel=b)
    entry = rt.topics["T"]
    assert not gc.is_tracked(entry)
    assert rt.channel_closed(1) == ["10.0.0.1:10911"]
    assert rt.topics["T"] is entry and sorted(entry) == ["b0", "b2"]
    assert not gc.is_tracked(entry)
    rt.channel_closed(0)
    rt.channel_closed(2)
    assert "T" not in rt.topics and rt.queue_count == 0


def test_a_table_smaller_than_a_step_is_applied_in_one_step() -> None:
    """A registration whose topics, counted and then stored, fit one step's budget is applied
    in one call, with no turn of the loop between (the route of a topic a send just created is
    known once its broker's registration is answered); a larger one spends a budget a step."""
    rt = RouteTable()
    who = Registrant(cluster="C", broker_name="b", broker_addr="10.0.0.1:10911", broker_id=0,
                     ha_server_addr="", now_ms=0, data_version=DataVersion(1, 1))
    small = [TopicConfig(topic_name=f"s{i}") for i in range(3)]
    assert rt.start_register(who, queue_table("b", 0, small)).step(6)
    assert sorted(rt.topics) == ["s0", "s1", "s2"]
    large = [TopicConfig(topic_name=f"l{i}") for i in range(8)]
    steps = 1
    registering = rt.start_register(attrs.evolve(who, data_version=DataVersion(1, 2)),
                                    queue_table("b", 0, [*small, *large]))
    while not registering.step(4):
        steps += 1
    # counted 4, 4, then 3 and 1 stored; then 4, 4 and the last 2 stored
    assert steps == 6 and len(rt.topics) == 11
