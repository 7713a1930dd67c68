"""What a name server does with a registration's topic table, over real sockets: a heartbeat
of an unchanged DataVersion applies nothing, a changed one is applied a step at a time while
other clients are served, and a broker that leaves meanwhile leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from structlog.testing import capture_logs

from evq.domain.clock import ManualClock
from evq.domain.codes import ResponseCode
from evq.domain.topics import TopicConfig
from evq.net import execution
from evq.net import namesrv as namesrv_module
from evq.net.codes import RequestCode
from evq.net.loop_lag import LoopLag
from evq.net.namesrv import NameServer
from evq.net.protocol import RemotingCommand
from evq.net.register_broker import (
    BrokerIdentity,
    DataVersion,
    RegisterBrokerBody,
    RegisterResult,
)
from evq.net.routes import RouteLimits, RouteTable
from evq.net.transport import RemotingClient, TransportError
from tests.net.harness import HOST, eventually
from tests.net.test_namesrv import MASTER, SLAVE, T, ask, namesrv, registrar, route, routed
from tests.net.test_route_bounds import check_tables

V1, V2 = DataVersion(1700000000000, 1), DataVersion(1700000000000, 2)
U = TopicConfig(topic_name="U", read_queue_nums=2, write_queue_nums=2)


LARGE_TABLE_TIMEOUT = 120.0
"""How long a registration of a large table may take to be answered: its decoding alone takes
seconds of a worker thread at 200,000 topics, and more on a machine whose two cores run
other tests too.  What the tests bound is the loop's stall, not this."""


async def register(client: RemotingClient, identity: BrokerIdentity = MASTER,
                   topics: tuple[TopicConfig, ...] = (T,), version: DataVersion = V1,
                   *, compressed: bool = False) -> RegisterResult:
    body = RegisterBrokerBody(topics=topics, data_version=version)
    answer = await ask(client, RequestCode.REGISTER_BROKER,
                       identity.register_fields(compressed=compressed),
                       body.encode(compressed), timeout=LARGE_TABLE_TIMEOUT)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return RegisterResult.from_response(answer)


def counts(rt: RouteTable) -> tuple[int, int]:
    return rt.applied, rt.heartbeats


@contextlib.asynccontextmanager
async def connected(server: NameServer) -> AsyncIterator[RemotingClient]:
    async with RemotingClient(HOST, server.port) as client:
        yield client


# --- an unchanged table ------------------------------------------------------------------------


async def test_a_heartbeat_of_an_unchanged_table_applies_nothing() -> None:
    clock = ManualClock()
    async with namesrv(clock) as server, connected(server) as broker, connected(server) as client:
        rt = server.routes
        await register(broker)
        assert counts(rt) == (1, 0)
        # Deleted here, the topic stays deleted while the broker's version stays (Java's rule):
        # the heartbeat did not read the table.
        await ask(client, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T", "clusterName": ""})
        clock.advance(30)
        await register(broker, topics=(T, U))
        assert counts(rt) == (1, 1)
        assert await route(client, "T") is None and await route(client, "U") is None
        assert rt.live[MASTER.broker_addr].last_update_ms == clock.now_ms()  # still refreshed
        # A changed version is applied: the deleted topic is back, the new one routed.
        await register(broker, topics=(T, U), version=V2)
        assert counts(rt) == (2, 1)
        assert await route(client, "T") is not None and await route(client, "U") is not None
        await register(broker, topics=(T, U), version=V2, compressed=True)
        assert counts(rt) == (2, 2)
        # Each body so far was another's (the compressed one too): each was decoded.
        assert server.bodies_decoded == 4


async def test_a_heartbeat_of_the_same_body_is_answered_without_decoding_it() -> None:
    """A broker sends its whole table with every heartbeat: the same bytes as the last body
    applied for its address are a heartbeat, told by their digest before any decoding."""
    clock = ManualClock()
    async with namesrv(clock) as server, connected(server) as broker, connected(server) as client:
        rt = server.routes
        await register(broker)
        assert (counts(rt), server.bodies_decoded) == ((1, 0), 1)
        clock.advance(30)
        await register(broker)
        assert (counts(rt), server.bodies_decoded) == ((1, 1), 1)
        assert rt.live[MASTER.broker_addr].last_update_ms == clock.now_ms()
        # As with the DataVersion rule, a topic deleted here stays deleted.
        await ask(client, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T", "clusterName": ""})
        await register(broker)
        assert (counts(rt), server.bodies_decoded) == ((1, 2), 1)
        assert await route(client, "T") is None
        # Another body of the same DataVersion is decoded, then taken for a heartbeat (Java's
        # rule); its next copy is not decoded again.
        await register(broker, topics=(T, U))
        assert (counts(rt), server.bodies_decoded) == ((1, 3), 2)
        await register(broker, topics=(T, U))
        assert (counts(rt), server.bodies_decoded) == ((1, 4), 2)
        assert await route(client, "U") is None
        # The same body from a slot the address does not hold, or after the broker was dropped,
        # is decoded and applied whole.
        moved = BrokerIdentity(cluster="C", broker_name="broker-b", broker_id=0,
                               broker_addr=MASTER.broker_addr)
        await register(broker, moved, topics=(T, U))
        assert (counts(rt), server.bodies_decoded) == ((2, 4), 3)
        await ask(client, RequestCode.UNREGISTER_BROKER, moved.unregister_fields())
        await register(broker, moved, topics=(T, U))
        assert (counts(rt), server.bodies_decoded) == ((3, 4), 4)
        assert await route(client, "T") is not None and await route(client, "U") is not None
        check_tables(rt)


async def test_tables_without_a_data_version_are_applied_unless_the_same_body() -> None:
    """A body without a DataVersion matches none (Java stamps each such body anew, so applies
    it): a changed table is applied, the same body again is a heartbeat by its digest."""
    async with namesrv() as server, connected(server) as broker, connected(server) as client:
        rt = server.routes
        for topics, applied in (((T,), (1, 0)), ((T, U), (2, 0)), ((T, U), (2, 1))):
            body = RegisterBrokerBody(topics=topics, data_version=None).encode()
            answer = await ask(broker, RequestCode.REGISTER_BROKER, MASTER.register_fields(),
                               body)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            assert counts(rt) == applied
        assert await route(client, "U") is not None


async def test_a_slaves_heartbeat_still_names_its_master() -> None:
    async with namesrv() as server, connected(server) as master, connected(server) as slave:
        assert (await register(slave, SLAVE)).master_addr is None
        await register(master)
        answer = await register(slave, SLAVE)  # the same version: a heartbeat
        assert (answer.master_addr, answer.master_ha_addr) == (
            MASTER.broker_addr, MASTER.ha_server_addr)
        assert counts(server.routes) == (2, 1)


async def test_a_broker_that_moved_or_was_dropped_is_applied_again_at_the_same_version(
) -> None:
    clock = ManualClock()
    async with namesrv(clock) as server, connected(server) as client:
        rt = server.routes
        applied = rt.applied

        async def applies(identity: BrokerIdentity, topics: tuple[TopicConfig, ...] = (T,)
                          ) -> None:
            nonlocal applied
            await register(client, identity, topics)
            assert rt.applied == applied + 1, identity
            applied = rt.applied

        # A slave's table is not routed; promoted on its address at the same version, it is.
        await applies(SLAVE, (U,))
        await applies(BrokerIdentity(cluster="C", broker_name="broker-a", broker_id=0,
                                     broker_addr=SLAVE.broker_addr), (U,))
        assert await route(client, "U") is not None
        # The master's slot taken by another address: the old master comes back applied.
        await applies(MASTER)
        assert rt.brokers["broker-a"].addrs == {0: MASTER.broker_addr}
        await applies(BrokerIdentity(cluster="C", broker_name="broker-a", broker_id=0,
                                     broker_addr=SLAVE.broker_addr), (U,))
        await applies(MASTER)
        # Listed in another cluster.
        await applies(BrokerIdentity(cluster="D", broker_name="broker-a", broker_id=0,
                                     broker_addr=MASTER.broker_addr))
        assert rt.listed["broker-a"] == {"C", "D"}
        # Dropped, then back: unregistered, expired, its connection closed.
        await ask(client, RequestCode.UNREGISTER_BROKER, MASTER.unregister_fields())
        await applies(MASTER)
        clock.advance(121)
        await eventually(lambda: MASTER.broker_addr not in rt.live)
        await applies(MASTER)
        async with connected(server) as other:
            await register(other)  # a heartbeat, over another connection now
        await eventually(lambda: MASTER.broker_addr not in rt.live)
        await applies(MASTER)
        heartbeats = rt.heartbeats
        await register(client)
        assert (rt.applied, rt.heartbeats) == (applied, heartbeats + 1)


async def test_a_table_changed_without_register_now_still_reaches_the_name_server() -> None:
    """A topic the broker makes without announcing it (a DLQ topic a consumer's send-back
    makes) moves the registrar's DataVersion too, at the next period, or the name server
    would take the table for a heartbeat."""
    table = [T]
    async with namesrv() as server, registrar([server], topics=table, period=0.05):
        await eventually(lambda: server.routes.heartbeats >= 2)  # unchanged: not applied
        assert server.routes.applied == 1
        table.append(U)
        await eventually(lambda: routed(server, "U"))
        assert server.routes.applied == 2


# --- a large table -----------------------------------------------------------------------------


def many(n: int) -> tuple[TopicConfig, ...]:
    return tuple(TopicConfig(topic_name=f"topic-{i}", read_queue_nums=8, write_queue_nums=8)
                 for i in range(n))


AT_THE_BOUND = 200_000


@functools.cache
def table_at_the_bound() -> bytes:
    """A compressed body of :data:`AT_THE_BOUND` topics (made once: zlib takes a while)."""
    return RegisterBrokerBody(topics=many(AT_THE_BOUND), data_version=V1).encode(compressed=True)


async def test_lookups_are_answered_while_a_table_at_the_bound_is_applied() -> None:
    """A registration at the topic-queue bound, applied whole on the loop, held it for about
    a second at 200,000 topics (seconds at the default bound): every other client waited."""
    topics, body = AT_THE_BOUND, table_at_the_bound()
    limits = RouteLimits(max_topic_queues=topics + 1)  # the other broker's topic and these
    lag = LoopLag(interval=0.005)
    slowest = 0.0
    registered = asyncio.Event()
    async with namesrv(limits=limits) as server, connected(server) as broker, \
            connected(server) as client:
        await register(client, BrokerIdentity(cluster="C", broker_name="other", broker_id=0,
                                              broker_addr="127.0.0.1:30911"))

        async def look_up() -> int:
            nonlocal slowest
            answered = 0
            while not registered.is_set():
                started = asyncio.get_running_loop().time()
                assert await route(client) is not None
                slowest = max(slowest, asyncio.get_running_loop().time() - started)
                answered += 1
                await asyncio.sleep(0.001)
            return answered

        watcher = asyncio.create_task(lag.run())
        lookups = asyncio.create_task(look_up())
        try:
            await eventually(lambda: lag.ticks >= 2)
            answer = await ask(broker, RequestCode.REGISTER_BROKER,
                               MASTER.register_fields(compressed=True), body,
                               timeout=LARGE_TABLE_TIMEOUT)
            registered.set()
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            answered = await lookups
        finally:
            watcher.cancel()
        assert server.routes.queue_count == topics + 1
        assert answered > 10
        # Generous: a step is a few ms; the tables' doubling and the decode's thread sharing
        # the GIL make the rest, on a loaded machine.
        assert lag.max_stall < 0.4, lag.max_stall
        assert slowest < 0.5, slowest
        check_tables(server.routes)


async def test_lookups_are_answered_while_a_closed_brokers_table_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker's topics go a step at a time when its connection closes: dropped in the close
    callback, a million held the loop 0.8-1.4 s, and one client may register such a table and
    close again and again.  No lookup is answered with them once the close is seen (a topic
    another broker serves too is routed to that one alone), and lookups are answered while
    they go."""
    monkeypatch.setattr(namesrv_module, "APPLY_STEP", 50)  # 20,000 topics: 400 steps
    topics = 20_000
    body = RegisterBrokerBody(topics=many(topics), data_version=V1).encode(compressed=True)
    lag = LoopLag(interval=0.005)
    async with namesrv() as server, connected(server) as client:
        rt = server.routes
        await register(client, BrokerIdentity(cluster="C", broker_name="other", broker_id=0,
                                              broker_addr="127.0.0.1:30911"),
                       topics=(T, *many(1)))
        broker = RemotingClient(HOST, server.port)
        answer = await ask(broker, RequestCode.REGISTER_BROKER,
                           MASTER.register_fields(compressed=True), body,
                           timeout=LARGE_TABLE_TIMEOUT)
        assert answer.code == ResponseCode.SUCCESS and rt.queue_count == topics + 2
        watcher = asyncio.create_task(lag.run())
        try:
            await eventually(lambda: lag.ticks >= 2)
            await broker.close()
            await eventually(lambda: MASTER.broker_addr not in rt.live)
            answered_while_leaving = 0
            while rt.leaving:
                assert await route(client, "topic-1") is None  # gone as the close is seen
                shared = await route(client, "topic-0")
                assert shared is not None
                assert [q["brokerName"] for q in shared["queueDatas"]] == ["other"]
                answered_while_leaving += 1
        finally:
            watcher.cancel()
        assert answered_while_leaving > 0
        assert rt.queue_count == 2 and sorted(rt.topics) == ["T", "topic-0"]
        assert lag.max_stall < 0.4, lag.max_stall
        check_tables(rt)


async def test_a_broker_dropped_while_its_table_is_applied_leaves_nothing_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Unregistered from another connection mid-apply, the registration drops the rest of its
    table; its own connection closed, its handler is cancelled.  Either way the broker's
    topics go, the other broker's (some the same topics) stay, and the tables stay whole."""
    monkeypatch.setattr(namesrv_module, "APPLY_STEP", 20)  # 20,000 topics: 1,000 steps
    table = many(20_000)
    body = RegisterBrokerBody(topics=table, data_version=V1).encode(compressed=True)
    async with namesrv() as server, connected(server) as client:
        rt = server.routes
        await register(client, BrokerIdentity(cluster="C", broker_name="other", broker_id=0,
                                              broker_addr="127.0.0.1:30911"),
                       topics=(T, *many(5)))
        left = sorted(["T", *(f"topic-{i}" for i in range(5))])

        async def dropped_while_applied(broker: RemotingClient, drop: Awaitable[object]
                                        ) -> RemotingCommand | TransportError:
            sent = asyncio.ensure_future(ask(broker, RequestCode.REGISTER_BROKER,
                                             MASTER.register_fields(compressed=True), body,
                                             timeout=LARGE_TABLE_TIMEOUT))
            await eventually(lambda: rt.queue_count > 6)  # storing has begun
            await drop
            try:
                return await sent
            except TransportError as exc:
                return exc
            finally:
                await eventually(lambda: MASTER.broker_addr not in rt.live)  # the close seen
                assert "broker-a" not in rt.brokers
                await eventually(lambda: not rt.leaving)  # its topics dropped a step at a time
                assert rt.queue_count == 6 and sorted(rt.topics) == left
                check_tables(rt)

        async with connected(server) as broker:
            with capture_logs() as logs:
                answer = await dropped_while_applied(broker, ask(
                    client, RequestCode.UNREGISTER_BROKER, MASTER.unregister_fields()))
            assert isinstance(answer, RemotingCommand) and answer.code == ResponseCode.SUCCESS
            (event,) = [e for e in logs if e["event"] == "broker_dropped_while_registering"]
            assert 0 < event["stored"] < len(table)
            found = await route(client, "topic-0")
            assert found is not None
            assert [b["brokerName"] for b in found["brokerDatas"]] == ["other"]  # type: ignore[attr-defined]

        broker = RemotingClient(HOST, server.port)
        assert isinstance(await dropped_while_applied(broker, broker.close()), TransportError)

        # The address comes back at the same version: applied, not taken for a heartbeat.
        async with connected(server) as again:
            await register(again, topics=table, compressed=True)
            assert rt.queue_count == 6 + len(table) and rt.heartbeats == 0
            check_tables(rt)


async def test_large_registrations_are_decoded_two_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations of large bodies sent at once are decoded and applied at most
    ``LARGE_BODIES_AT_ONCE`` at a time, the rest waiting undecoded: each table may be hundreds
    of MB once decoded, and the executor would decode as many as it has threads."""
    running = most = 0
    lock = threading.Lock()
    decode = namesrv_module._decoded

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            time.sleep(0.05)  # long enough for the others to start, were they let
            return decode(*args, **kwargs)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(namesrv_module, "_decoded", counted)
    table = many(1_000)
    body = RegisterBrokerBody(topics=table, data_version=V1).encode()
    assert len(body) >= execution.LARGE_WORK
    brokers = [BrokerIdentity(cluster="C", broker_name=f"broker-{n}", broker_id=0,
                              broker_addr=f"127.0.0.1:{31000 + n}") for n in range(6)]
    async with namesrv() as server, contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connected(server)) for _ in brokers]
        answers = await asyncio.gather(*(
            ask(c, RequestCode.REGISTER_BROKER, b.register_fields(), body,
                timeout=LARGE_TABLE_TIMEOUT) for c, b in zip(clients, brokers, strict=True)))
        assert all(a.code == ResponseCode.SUCCESS for a in answers)
        assert server.routes.queue_count == len(brokers) * len(table)
        check_tables(server.routes)
    assert most == namesrv_module.LARGE_BODIES_AT_ONCE
