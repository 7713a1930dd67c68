"""``evq admin`` against a real name server and broker: every command through ``--json``, the
failures' exit status and one-line reasons, and one human table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evq.domain.record import parse_offset_msg_id
from tests.client.conftest import Served
from tests.processes import run_evq


def admin(served: Served, *args: str) -> Any:
    out = run_evq("admin", *args, "-n", served.namesrv, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def fails(served: Served | None, *args: str) -> str:
    namesrv = served.namesrv if served else "127.0.0.1:1"
    out = run_evq("admin", *args, "-n", namesrv)
    assert out.returncode != 0 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evq: error: "), out.stderr
    return lines[0]


def produce(served: Served, topic: str, lines: list[str], keys: str) -> list[dict[str, Any]]:
    out = run_evq("produce", "-n", served.namesrv, "-t", topic, "--keys", keys,
                  stdin="".join(f"{x}\n" for x in lines))
    assert out.returncode == 0, out.stderr
    return [json.loads(x) for x in out.stdout.splitlines()]


def test_topics_created_listed_routed_and_deleted(cluster: Served) -> None:
    [broker] = admin(cluster, "clusterList")["brokers"]
    assert (broker["cluster"], broker["broker_id"], broker["addr"]) == (
        "DefaultCluster", 0, cluster.broker)
    updated = admin(cluster, "updateTopic", "-t", "AdmT", "-c", "DefaultCluster", "-r", "3",
                    "-w", "3", "-o", "true")
    assert [b["addr"] for b in updated["brokers"]] == [cluster.broker]
    assert "AdmT" in admin(cluster, "topicList")["topics"]
    route = admin(cluster, "topicRoute", "-t", "AdmT")
    assert route["brokers"] == [{"broker_name": broker["broker_name"], "broker_id": 0,
                                 "addr": cluster.broker}]
    assert [(q["read_queue_nums"], q["write_queue_nums"]) for q in route["queues"]] == [(3, 3)]
    status = admin(cluster, "topicStatus", "-t", "AdmT")["queues"]
    assert [(q["queue_id"], q["min_offset"], q["max_offset"]) for q in status] == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0)]
    admin(cluster, "deleteTopic", "-t", "AdmT", "-c", "DefaultCluster")
    assert "AdmT" not in admin(cluster, "topicList")["topics"]
    assert fails(cluster, "topicRoute", "-t", "AdmT") == (
        "evq: error: topic 'AdmT' does not exist")


def test_messages_found_by_key_id_and_offset(cluster: Served) -> None:
    sent = produce(cluster, "AdmM", ["one", "two"], "order-1")
    by_key = admin(cluster, "queryMsgByKey", "-t", "AdmM", "-k", "order-1")["messages"]
    assert sorted(m["body"] for m in by_key) == ["one", "two"]
    first = sent[0]
    [by_offset_id] = admin(cluster, "queryMsgById", "-i", first["offsetMsgId"])["messages"]
    [by_uniq] = admin(cluster, "queryMsgById", "-i", first["msgId"], "-t", "AdmM")["messages"]
    [at] = admin(cluster, "queryMsgByOffset", "-t", "AdmM", "-b", first["brokerName"], "-i",
                 str(first["queueId"]), "-o", str(first["queueOffset"]))["messages"]
    for m in (by_offset_id, by_uniq, at):
        assert (m["body"], m["msgId"], m["offsetMsgId"]) == ("one", first["msgId"],
                                                             first["offsetMsgId"])
    assert parse_offset_msg_id(at["offsetMsgId"])[1] >= 0
    assert "no message at offset 99" in fails(
        cluster, "queryMsgByOffset", "-t", "AdmM", "-b", first["brokerName"], "-i",
        str(first["queueId"]), "-o", "99")
    assert "no message of 'AdmM' with key 'nope'" in fails(
        cluster, "queryMsgByKey", "-t", "AdmM", "-k", "nope")


def test_group_progress_connection_and_reset_by_time(cluster: Served) -> None:
    produce(cluster, "AdmG", ["a", "b", "c", "d"], "k")
    admin(cluster, "updateSubGroup", "-g", "AdmGroup", "-b", cluster.broker, "-i", "0", "-w",
          "1", "-q", "3")
    out = run_evq("consume", "-n", cluster.namesrv, "-t", "AdmG", "-g", "AdmGroup",
                  "--from-beginning", "--count", "4")
    assert out.returncode == 0, out.stderr
    progress = admin(cluster, "consumerProgress", "-g", "AdmGroup")
    assert progress["total_lag"] == 0
    assert sum(q["consumer_offset"] for q in progress["queues"]) == 4
    reset = admin(cluster, "resetOffsetByTime", "-g", "AdmGroup", "-t", "AdmG", "-s", "0",
                  "--force")
    assert [q["offset"] for q in reset["queues"]] == [0] * len(reset["queues"])
    again = admin(cluster, "consumerProgress", "-g", "AdmGroup", "-t", "AdmG")
    assert again["total_lag"] == 4
    assert "CONSUMER_NOT_ONLINE" in fails(cluster, "consumerConnection", "-g", "AdmGroup")
    admin(cluster, "deleteSubGroup", "-g", "AdmGroup", "-c", "DefaultCluster")
    status = admin(cluster, "brokerStatus", "-b", cluster.broker)
    assert status["brokerRole"] == "ASYNC_MASTER" and int(status["commitLogMaxOffset"]) > 0
    assert 0 < float(status["commitLogDiskRatio"]) < 1 and status["evqPutsRefused"] == "false"


def test_a_group_config_written_by_update_sub_group_is_read_back(cluster: Served) -> None:
    admin(cluster, "updateSubGroup", "-g", "AdmCfg", "-b", cluster.broker, "-i", "1", "-w", "2",
          "-r", "3", "-s", "false")
    (config,) = admin(cluster, "getConsumerConfig", "-g", "AdmCfg")["configs"]
    assert config["addr"] == cluster.broker and config["groupName"] == "AdmCfg"
    assert (config["brokerId"], config["whichBrokerWhenConsumeSlowly"]) == (1, 2)
    assert (config["retryQueueNums"], config["consumeEnable"]) == (3, False)
    assert "no broker has the subscription group 'Nope'" in fails(
        cluster, "getConsumerConfig", "-g", "Nope")


async def test_a_live_member_is_listed_by_consumer_connection(cluster: Served) -> None:
    import asyncio

    from evq.client.consumer import ConsumeResult, PushConsumer
    from evq.domain.message import Message

    async def ignore(msgs: list[Message]) -> ConsumeResult:
        return ConsumeResult.CONSUME_SUCCESS

    produce(cluster, "AdmC", ["x"], "k")
    consumer = PushConsumer("AdmLive", cluster.namesrv, listener=ignore, client_id="cid-adm")
    consumer.subscribe("AdmC")
    async with consumer:
        info = await asyncio.to_thread(admin, cluster, "consumerConnection", "-g", "AdmLive")
    assert [c["clientId"] for c in info["connectionSet"]] == ["cid-adm"]
    assert info["messageModel"] == "CLUSTERING" and "AdmC" in info["subscriptionTable"]


@pytest.mark.parametrize("args, reason", [
    (("topicStatus", "-t", "Missing"), "topic 'Missing' does not exist"),
    (("updateTopic", "-t", "bad topic!", "-c", "DefaultCluster"), "bad topic!"),
    (("updateTopic", "-t", "T", "-c", "NoSuchCluster"), "no master broker in cluster"),
    (("resetOffsetByTime", "-g", "G", "-t", "T", "-s", "yesterday"), "yyyy-MM-dd#HH:mm:ss:SSS"),
])
def test_failures_exit_non_zero_with_one_line(cluster: Served, args: tuple[str, ...],
                                              reason: str) -> None:
    assert reason in fails(cluster, *args)


def test_an_unreachable_name_server_is_one_line() -> None:
    assert fails(None, "topicList") == (
        "evq: error: no name server reachable for topic list (tried 127.0.0.1:1: cannot "
        "connect to 127.0.0.1:1: [Errno 111] Connection refused)")


def test_bad_arguments_are_usage_errors() -> None:
    out = run_evq("admin", "updateTopic", "-t", "T")  # neither -c nor -b
    assert out.returncode == 2 and "one of the arguments -c/--cluster -b/--broker" in out.stderr


def test_people_get_an_aligned_table(cluster: Served) -> None:
    out = run_evq("admin", "clusterList", "-n", cluster.namesrv)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ["cluster", "broker_name", "broker_id", "addr"]
    assert row.index(cluster.broker) == header.index("addr")
    assert row.split()[0] == "DefaultCluster"
