"""The name server and the broker's registrar over real sockets on 127.0.0.1 (free ports)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from evq.domain.clock import ManualClock
from evq.domain.codes import ResponseCode
from evq.domain.topics import PERM_RW, TopicConfig
from evq.net.codes import RequestCode, Version
from evq.net.headers.namesrv import GetRouteInfoRequest
from evq.net.namesrv import NameServer
from evq.net.protocol import RemotingCommand
from evq.net.register_broker import BrokerIdentity, DataVersion, RegisterBrokerBody, body_crc32
from evq.net.registration import BrokerRegistrar
from evq.net.routes import ORDER_TOPIC_CONFIG, RouteLimits
from evq.net.transport import Connection, Dispatcher, RemotingClient, RemotingServer, split_address
from tests.net.harness import HOST, TIMEOUT, eventually
from tests.processes import free_port

T = TopicConfig(topic_name="T", read_queue_nums=4, write_queue_nums=2)
MASTER = BrokerIdentity(cluster="C", broker_name="broker-a", broker_id=0,
                        broker_addr="127.0.0.1:10911", ha_server_addr="127.0.0.1:10912")
SLAVE = BrokerIdentity(cluster="C", broker_name="broker-a", broker_id=1,
                       broker_addr="127.0.0.1:10921", ha_server_addr="127.0.0.1:10922")
SCAN = 0.01  # seconds between expiry scans in tests


@contextlib.asynccontextmanager
async def namesrv(clock: ManualClock | None = None, **options: Any) -> AsyncIterator[NameServer]:
    async with NameServer(HOST, 0, clock=clock or ManualClock(), scan_interval=SCAN,
                          first_scan_delay=0, **options) as server:
        yield server


def registrar(servers: list[NameServer] | list[str], identity: BrokerIdentity = MASTER,
              topics: list[TopicConfig] | None = None, **options: object) -> BrokerRegistrar:
    addrs = [s if isinstance(s, str) else s.address for s in servers]
    table = [T] if topics is None else topics
    return BrokerRegistrar(addrs, identity, lambda: table, first_delay=0,
                           **options)  # type: ignore[arg-type]


async def ask(client: RemotingClient, code: int, fields: Mapping[str, object] | None = None,
              body: bytes = b"", timeout: float = TIMEOUT) -> RemotingCommand:
    return await client.invoke(RemotingCommand.request(code, fields, body), timeout)


async def route(client: RemotingClient, topic: str = "T") -> dict[str, object] | None:
    answer = await ask(client, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                       GetRouteInfoRequest.write(topic=topic))
    if answer.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert answer.code == ResponseCode.SUCCESS
    return json.loads(answer.body)  # standard JSON: both clients parse it (§2.3.1)


def routed(server: NameServer, topic: str = "T") -> bool:
    return server.routes.route(topic) is not None


# --- registration and routes -------------------------------------------------------------------


async def test_a_registered_broker_is_routed_to_clients() -> None:
    async with namesrv() as server, RemotingClient(HOST, server.port) as client:
        assert await route(client) is None
        async with registrar([server]) as broker:
            await eventually(lambda: routed(server))
            assert await route(client) == {
                "brokerDatas": [{"brokerAddrs": {"0": "127.0.0.1:10911"},
                                 "brokerName": "broker-a", "cluster": "C"}],
                "filterServerTable": {},
                "queueDatas": [{"brokerName": "broker-a", "perm": PERM_RW, "readQueueNums": 4,
                                "topicSysFlag": 0, "writeQueueNums": 2}],
            }
            assert broker.master_addr is None  # a master is told no master
            assert broker.last_result(server.address) is not None


async def test_unknown_topic_answers_javas_remark() -> None:
    async with namesrv() as server, RemotingClient(HOST, server.port) as client:
        answer = await ask(client, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NOPE"})
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
        assert answer.remark == ("No topic route info in name server for the topic: NOPE\n"
                                 "See http://rocketmq.apache.org/docs/faq/ for further details.")
        assert answer.body == b""


async def test_compressed_registration() -> None:
    async with namesrv() as server, registrar([server], compressed=True):
        await eventually(lambda: routed(server))
        assert server.routes.queues("T")["broker-a"].write_queue_nums == 2


async def test_slaves_learn_their_masters_address_and_ha_address() -> None:
    async with namesrv() as server, registrar([server], SLAVE, period=3600) as slave:
        await eventually(lambda: slave.last_result(server.address) is not None)
        assert slave.master_addr is None  # no master registered yet
        async with registrar([server], MASTER):
            await eventually(lambda: routed(server))
            slave.register_now()
            await eventually(lambda: slave.master_addr is not None)
            assert (slave.master_addr, slave.master_ha_addr) == (
                "127.0.0.1:10911", "127.0.0.1:10912")
            addrs = server.routes.route("T")["brokerDatas"][0]["brokerAddrs"]  # type: ignore[index]
            assert addrs == {"0": "127.0.0.1:10911", "1": "127.0.0.1:10921"}
        # The master left; what the slave was told stays until a name server says otherwise.
        assert slave.master_addr == "127.0.0.1:10911"


async def test_register_now_sends_a_changed_topic_table_at_once() -> None:
    table = [T]
    async with namesrv() as server, registrar([server], topics=table, period=3600) as broker:
        await eventually(lambda: routed(server))
        table.append(TopicConfig(topic_name="NEW", read_queue_nums=1, write_queue_nums=1))
        broker.register_now()
        await eventually(lambda: routed(server, "NEW"))


async def test_the_data_version_moves_with_every_table_change_announced_or_not() -> None:
    """A name server applies a table only when its DataVersion moved, so it moves whenever
    the table does, without register_now too (a DLQ topic a consumer's send-back makes)."""
    sent: dict[frozenset[str], set[DataVersion]] = {}  # table -> the versions it went with

    async def record(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = RegisterBrokerBody.decode(cmd.body)
        sent.setdefault(frozenset(t.topic_name for t in body.topics), set()).add(
            body.data_version)
        return cmd.response()

    server = RemotingServer(HOST, 0, Dispatcher({RequestCode.REGISTER_BROKER: record}))
    await server.start()
    table = [T]
    try:
        async with registrar([server.address], topics=table, period=0.01):
            await eventually(lambda: len(sent) == 1)
            table.append(TopicConfig(topic_name="DLQ"))
            await eventually(lambda: len(sent) == 2)
            table.pop()
            await eventually(lambda: len(sent[frozenset({"T"})]) == 2)  # as it was before
    finally:
        await server.shutdown(grace=0.1)
    (changed,) = sent[frozenset({"T", "DLQ"})]
    first, last = sorted(v.counter for v in sent[frozenset({"T"})])
    assert first < changed.counter < last


async def test_every_name_server_gets_the_registration() -> None:
    async with namesrv() as one, namesrv() as two, registrar([one, two]) as broker:
        await eventually(lambda: routed(one) and routed(two))
        assert broker.namesrv_addrs == [one.address, two.address]


async def test_a_name_server_that_does_not_answer_delays_no_other() -> None:
    stuck = asyncio.Event()

    async def never_answer(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        stuck.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    hung = RemotingServer(HOST, 0, Dispatcher({RequestCode.REGISTER_BROKER: never_answer}))
    await hung.start()
    try:
        async with namesrv() as server, registrar([hung.address, server.address],
                                                  timeout=TIMEOUT * 4):
            async with asyncio.timeout(TIMEOUT):
                await stuck.wait()
                await eventually(lambda: routed(server))
    finally:
        await hung.shutdown(grace=0.1)


async def test_a_name_server_that_is_down_delays_no_other() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind((HOST, 0))
        down = f"{HOST}:{probe.getsockname()[1]}"
    async with namesrv() as server, registrar([down, server.address]) as broker:
        await eventually(lambda: routed(server))
        assert broker.last_result(down) is None


async def test_shutdown_unregisters_at_once() -> None:
    clock = ManualClock()
    async with namesrv(clock) as server:
        broker = registrar([server])
        await broker.start()
        await eventually(lambda: routed(server))
        await broker.shutdown()
        assert not routed(server) and server.routes.live == {}


# --- leaving without a word ----------------------------------------------------------------------


async def test_silent_brokers_expire_after_120_s() -> None:
    clock = ManualClock()
    async with namesrv(clock) as server, registrar([server], period=3600):
        await eventually(lambda: routed(server))
        clock.advance(120)
        assert server.scan() == []  # 120 s is still alive; Java drops strictly older
        clock.advance(0.001)
        await eventually(lambda: not routed(server))  # the periodic scan took it
        assert server.routes.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


async def test_heartbeats_keep_a_broker_alive() -> None:
    clock = ManualClock()
    async with namesrv(clock) as server, registrar([server], period=3600) as broker:
        await eventually(lambda: routed(server))
        clock.advance(100)
        broker.register_now()
        await eventually(
            lambda: server.routes.live[MASTER.broker_addr].last_update_ms == clock.now_ms())
        clock.advance(100)
        assert server.scan() == []
        assert routed(server)


async def test_a_closed_broker_connection_drops_the_broker_at_once() -> None:
    async with namesrv() as server:
        client = RemotingClient(HOST, server.port)
        body = RegisterBrokerBody(topics=(T,)).encode()
        answer = await ask(client, RequestCode.REGISTER_BROKER,
                           MASTER.register_fields(), body)
        assert answer.code == ResponseCode.SUCCESS
        assert routed(server)
        await client.close()
        await eventually(lambda: not routed(server))
        assert server.routes.live == {}


# --- cluster, topics, KV -------------------------------------------------------------------------


async def test_cluster_info_topic_lists_and_topic_deletion() -> None:
    other = TopicConfig(topic_name="U")
    async with namesrv() as server, registrar([server], topics=[T, other]), \
            RemotingClient(HOST, server.port) as client:
        await eventually(lambda: routed(server, "U"))
        info = json.loads((await ask(client, RequestCode.GET_BROKER_CLUSTER_INFO)).body)
        assert info == {
            "brokerAddrTable": {"broker-a": {"brokerAddrs": {"0": "127.0.0.1:10911"},
                                             "brokerName": "broker-a", "cluster": "C"}},
            "clusterAddrTable": {"C": ["broker-a"]},
        }
        listed = await ask(client, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        assert sorted(json.loads(listed.body)["topicList"]) == ["T", "U"]  # no order, as Java
        by_cluster = await ask(client, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "C"})
        assert sorted(json.loads(by_cluster.body)["topicList"]) == ["T", "U"]
        nothing = await ask(client, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "X"})
        assert json.loads(nothing.body) == {"topicList": []}
        await ask(client, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "U", "clusterName": ""})
        await ask(client, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T", "clusterName": "X"})
        assert await route(client, "U") is None
        assert await route(client, "T") is not None


async def test_a_topic_list_is_built_once_a_change_and_kept_for_known_clusters_only() -> None:
    """Anyone may ask for the topic list, and at the table's bound one took the loop 1.5 s to
    build: the answer is kept until a topic or a cluster listing changes (the first build of
    a large one runs in a worker thread)."""
    clock = ManualClock()  # the registrations below stay fresh: the scan expires none
    async with namesrv(clock) as server, RemotingClient(HOST, server.port) as client:
        rt = server.routes
        many = [TopicConfig(topic_name=f"T{i}") for i in range(20_000)]  # past LARGE_WORK
        rt.register(cluster="C", broker_name="b", broker_addr="h:1", broker_id=0,
                    ha_server_addr="", topics=many, now_ms=clock.now_ms())
        building = asyncio.ensure_future(server.topic_list_body())
        assert await route(client, "T7") is not None  # served meanwhile
        first = await building
        assert sorted(json.loads(first)["topicList"]) == sorted(t.topic_name for t in many)
        assert await server.topic_list_body() is first  # kept
        for _ in range(3):  # clusters nobody has: answered, never kept
            unknown = await ask(client, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "X"})
            assert json.loads(unknown.body) == {"topicList": []}
        by_cluster = await server.topic_list_body("C")
        assert await server.topic_list_body("C") is by_cluster
        assert set(server._topic_lists) == {None, "C"}
        rt.register(cluster="C", broker_name="b", broker_addr="h:1", broker_id=0,
                    ha_server_addr="", topics=many, now_ms=clock.now_ms())  # a heartbeat: no change
        assert await server.topic_list_body() is first
        rt.register(cluster="D", broker_name="d", broker_addr="h:2", broker_id=0,
                    ha_server_addr="", topics=[TopicConfig(topic_name="New")],
                    now_ms=clock.now_ms())
        listed = await ask(client, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        assert "New" in json.loads(listed.body)["topicList"]
        assert await server.topic_list_body("C") is not by_cluster  # a listing changed
        rt.delete_topic("New")
        assert "New" not in json.loads(await server.topic_list_body())["topicList"]


async def test_kv_config_and_the_order_topic_conf() -> None:
    async with namesrv() as server, RemotingClient(HOST, server.port) as client:
        key = {"namespace": ORDER_TOPIC_CONFIG, "key": "T"}
        missing = await ask(client, RequestCode.GET_KV_CONFIG, key)
        assert (missing.code, missing.remark) == (
            ResponseCode.QUERY_NOT_FOUND, "No config item, Namespace: ORDER_TOPIC_CONFIG Key: T")
        no_list = await ask(client, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "NS"})
        assert (no_list.code, no_list.remark) == (
            ResponseCode.QUERY_NOT_FOUND, "No config item, Namespace: NS")
        put = await ask(client, RequestCode.PUT_KV_CONFIG, {**key, "value": "broker-a:2"})
        assert put.code == ResponseCode.SUCCESS
        got = await ask(client, RequestCode.GET_KV_CONFIG, key)
        assert got.ext_fields == {"value": "broker-a:2"}
        listed = await ask(client, RequestCode.GET_KVLIST_BY_NAMESPACE,
                           {"namespace": ORDER_TOPIC_CONFIG})
        assert json.loads(listed.body) == {"table": {"T": "broker-a:2"}}

        async with registrar([server]) as broker:
            # The name server routes the broker before the registrar has read the answer
            # that carries the order topic config: wait for both.
            await eventually(lambda: routed(server) and broker.order_topic_config is not None)
            assert broker.order_topic_config == {"T": "broker-a:2"}
            assert (await route(client))["orderTopicConf"] == "broker-a:2"  # type: ignore[index]

        deleted = await ask(client, RequestCode.DELETE_KV_CONFIG, key)
        assert deleted.code == ResponseCode.SUCCESS
        assert (await ask(client, RequestCode.GET_KV_CONFIG, key)).code == \
            ResponseCode.QUERY_NOT_FOUND


# --- bounds ---------------------------------------------------------------------------------------


def broker(n: int) -> BrokerIdentity:
    return BrokerIdentity(cluster="C", broker_name=f"broker-{n}", broker_id=0,
                          broker_addr=f"127.0.0.1:{20000 + n}")


async def test_past_its_bounds_a_name_server_refuses_and_serves_what_it_holds() -> None:
    limits = RouteLimits(max_broker_addresses=2, max_kv_entries=1, max_kv_bytes=16)
    body = RegisterBrokerBody(topics=(T,)).encode()
    async with namesrv(limits=limits) as server, RemotingClient(HOST, server.port) as client:
        for n in (0, 1):
            answer = await ask(client, RequestCode.REGISTER_BROKER, broker(n).register_fields(),
                               body)
            assert answer.code == ResponseCode.SUCCESS
        for _ in range(2):
            past = await ask(client, RequestCode.REGISTER_BROKER, broker(2).register_fields(),
                             body)
            assert (past.code, past.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "the name server holds 2 broker addresses, its most (maxBrokerAddresses)")
        heartbeat = await ask(client, RequestCode.REGISTER_BROKER, broker(0).register_fields(),
                              body)
        assert heartbeat.code == ResponseCode.SUCCESS
        found = await route(client)
        assert found is not None
        assert [b["brokerName"] for b in found["brokerDatas"]] == ["broker-0", "broker-1"]  # type: ignore[attr-defined]
        assert server.refusals["maxBrokerAddresses"].count == 2

        kv = {"namespace": "N", "key": "k"}
        assert (await ask(client, RequestCode.PUT_KV_CONFIG, {**kv, "value": "v"})).code == \
            ResponseCode.SUCCESS
        more = await ask(client, RequestCode.PUT_KV_CONFIG, {**kv, "key": "k2", "value": "v"})
        assert (more.code, more.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "the name server holds 1 KV config entries, its most (maxKvEntries)")
        big = await ask(client, RequestCode.PUT_KV_CONFIG, {**kv, "value": "v" * 15})
        assert (big.code, big.remark) == (
            ResponseCode.SYSTEM_ERROR, "a KV config entry of 17 bytes (namespace, key and value) "
                                       "is past the most, 16 (maxKvBytes)")
        got = await ask(client, RequestCode.GET_KV_CONFIG, kv)
        assert got.ext_fields == {"value": "v"}
        assert (server.refusals["maxKvEntries"].count, server.refusals["maxKvBytes"].count,
                server.refusals["maxTopicQueues"].count) == (1, 1, 0)


# --- bad requests ---------------------------------------------------------------------------------


async def test_bad_requests_get_clear_answers_and_the_server_carries_on() -> None:
    body = RegisterBrokerBody(topics=(T,)).encode()
    fields = MASTER.register_fields()  # bodyCrc32 0: the body is not checked
    without_name = {k: v for k, v in fields.items() if k != "brokerName"}
    cases: list[tuple[int, Mapping[str, object], bytes, int, str]] = [
        (RequestCode.REGISTER_BROKER, without_name, body, ResponseCode.SYSTEM_ERROR,
         "the custom field <brokerName> is null"),
        (RequestCode.REGISTER_BROKER, {**fields, "brokerId": "zero"}, body,
         ResponseCode.SYSTEM_ERROR, "the custom field <brokerId> is not a valid long"),
        (RequestCode.REGISTER_BROKER, fields, b"{not json", ResponseCode.SYSTEM_ERROR,
         "Failed to decode RegisterBrokerBody: body is not JSON"),
        (RequestCode.REGISTER_BROKER, {**fields, "compressed": "true"}, body,
         ResponseCode.SYSTEM_ERROR, "Failed to decode RegisterBrokerBody: not a zlib stream"),
        (RequestCode.REGISTER_BROKER, {**fields, "bodyCrc32": body_crc32(body) ^ 1}, body,
         ResponseCode.SYSTEM_ERROR, "crc32 not match"),
        (RequestCode.REGISTER_BROKER, {**fields, "compressed": "maybe"}, body,
         ResponseCode.SYSTEM_ERROR, "the custom field <compressed> is not a valid boolean"),
        (RequestCode.UNREGISTER_BROKER, {}, b"", ResponseCode.SYSTEM_ERROR,
         "the custom field <clusterName> is null"),
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, {}, b"", ResponseCode.SYSTEM_ERROR,
         "the custom field <topic> is null"),
        (RequestCode.PUT_KV_CONFIG, {"namespace": "N", "key": "k"}, b"",
         ResponseCode.SYSTEM_ERROR, "the custom field <value> is null"),
        (RequestCode.SEND_MESSAGE, {}, b"", ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
         " request type 10 not supported"),
    ]
    async with namesrv() as server, RemotingClient(HOST, server.port) as client:
        for code, ext, payload, expected, remark in cases:
            answer = await ask(client, code, ext, payload)
            assert answer.code == expected, answer
            assert answer.remark is not None and answer.remark.startswith(remark), answer
        assert server.routes.live == {}
        good = await ask(client, RequestCode.REGISTER_BROKER,
                         {**fields, "bodyCrc32": body_crc32(body)}, body)
        assert good.code == ResponseCode.SUCCESS
        assert await route(client) is not None


async def test_a_java_broker_registration_as_it_comes_off_the_wire() -> None:
    # fastjson's body, ints and booleans as strings in extFields, version 4.9.7.
    body = (b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
            b'{"counter":2,"timestamp":1700000000000},"topicConfigTable":{"TopicTest":'
            b'{"order":false,"perm":6,"readQueueNums":8,"topicFilterType":"SINGLE_TAG",'
            b'"topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":8}}}}')
    request = RemotingCommand(
        code=RequestCode.REGISTER_BROKER, version=Version.V4_9_7,
        ext_fields=MASTER.register_fields(body_crc32=body_crc32(body)),
        body=body)
    async with namesrv() as server, RemotingClient(HOST, server.port) as client:
        answer = await client.invoke(request, TIMEOUT)
        assert answer.code == ResponseCode.SUCCESS and answer.body == b""
        assert answer.ext_fields == {}  # a master: no masterAddr, no haServerAddr
        assert (await route(client, "TopicTest"))["queueDatas"][0]["readQueueNums"] == 8  # type: ignore[index]


def test_split_address() -> None:
    assert split_address("10.0.0.1:9876") == ("10.0.0.1", 9876)
    for bad in ("10.0.0.1", ":9876", "h:0", "h:65536", "h:x", "h:"):
        with pytest.raises(ValueError, match="host:port"):
            split_address(bad)


# --- evq namesrv as a process ---------------------------------------------------------------------

ROOT = Path(__file__).parents[2]


def evq(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "evq.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_evq_namesrv_serves_routes_and_stops_on_sigterm() -> None:
    port = free_port()
    with evq("namesrv", "--port", str(port)) as child:
        assert child.stdout is not None and child.stderr is not None
        assert child.stdout.readline() == f"evq namesrv listening on {HOST}:{port}\n"

        async def scenario() -> tuple[RemotingCommand, dict[str, object] | None]:
            async with RemotingClient(HOST, port) as client:
                nope = await ask(client, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NOPE"})
                async with registrar([f"{HOST}:{port}"]) as broker:
                    await eventually(lambda: broker.last_result(f"{HOST}:{port}") is not None)
                    return nope, await route(client)

        nope, found = asyncio.run(scenario())
        assert nope.code == ResponseCode.TOPIC_NOT_EXIST
        assert found is not None and found["brokerDatas"][0]["brokerName"] == "broker-a"  # type: ignore[index]
        child.send_signal(signal.SIGTERM)
        assert child.wait(TIMEOUT) == 0
        assert child.stdout.read() == ""
        logs = [json.loads(line) for line in child.stderr.read().splitlines()]
        assert {"listening", "broker_registered", "stopped"} <= {e["event"] for e in logs}


def test_evq_namesrv_on_a_taken_port_exits_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with evq("namesrv", "--port", str(port)) as child:
            out, err = child.communicate(timeout=TIMEOUT * 2)
    assert child.returncode == 1
    assert out == ""
    assert err == f"evq: error: cannot listen on {HOST}:{port}: Address already in use\n"


def test_evq_namesrv_takes_its_bounds_from_its_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "namesrv.conf"
    conf.write_text("maxBrokerAddresses=1\n")
    port = free_port()
    with evq("namesrv", "--port", str(port), "--config", str(conf)) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == f"evq namesrv listening on {HOST}:{port}\n"

        async def scenario() -> list[RemotingCommand]:
            body = RegisterBrokerBody(topics=(T,)).encode()
            async with RemotingClient(HOST, port) as client:
                return [await ask(client, RequestCode.REGISTER_BROKER,
                                  broker(n).register_fields(), body) for n in (0, 1)]

        first, second = asyncio.run(scenario())
        child.send_signal(signal.SIGTERM)
        assert child.wait(TIMEOUT) == 0
    assert first.code == ResponseCode.SUCCESS
    assert (second.code, second.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "the name server holds 1 broker addresses, its most (maxBrokerAddresses)")
