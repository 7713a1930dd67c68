"""The name server: RocketMQ's NameServer over :class:`~evq.net.routes.RouteTable`.

Brokers register here every 30 s with their topic tables; clients ask here which brokers serve
a topic.  Several name servers run side by side without talking to each other: every broker
registers with each of them, and a client may ask any.  So the state is soft: nothing is
persisted, a restarted name server is complete again after one registration round.

A broker leaves the tables when it unregisters, when the connection it registered over closes,
or when it has been silent for 120 s; the scan for silent brokers runs every 10 s, first after
5 s, as in Java.  Ages are read from the injected clock; only the scan cadence is wall time, so
a test moves the clock and lets a short ``scan_interval`` notice.

A registration's body is decoded, and its topics made queue data, in a worker thread when it is
large; a heartbeat of an unchanged table then only refreshes the broker, and a changed table is
applied :data:`APPLY_STEP` topics at a time with the loop turning between steps, one
registration after another (:class:`~evq.net.routes.Registering`).  At the bound, a million
topics, applying one whole took the loop for 3 to 5 s, and anyone may register.

Every table has a bound (:class:`~evq.net.routes.RouteLimits`): a registration or KV entry
that would take one past it is answered SYSTEM_ERROR with a remark naming the bound, and
nothing of it is applied; :attr:`NameServer.refusals` counts them and a warning a bound says
how many at most every 10 s, so a flood of them cannot flood the log either.

With an ACL file (``evq namesrv --acl-file``), the requests that change the tables
(:data:`WRITE_CODES`) are refused NO_PERMISSION unless an admin account of that file signed
them (:func:`evq.acl.verifier.verify`, as the broker checks them: all of them are
admin-only codes); lookups stay open, as every client needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path
from typing import Final

import attrs

from evq import logs
from evq.acl.verifier import Deny
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.codes import BrokerError, ResponseCode
from evq.net import execution, fastjson
from evq.net.acl_check import RefusalLog, decide
from evq.net.acl_file import AclFile
from evq.net.codes import RequestCode
from evq.net.headers.namesrv import (
    DeleteKVConfigRequest,
    DeleteTopicFromNamesrvRequest,
    GetKVConfigRequest,
    GetKVConfigResponse,
    GetKVListByNamespaceRequest,
    GetRouteInfoRequest,
    GetTopicsByClusterRequest,
    PutKVConfigRequest,
    RegisterBrokerRequest,
    UnRegisterBrokerRequest,
)
from evq.net.protocol import RemotingCommand
from evq.net.refusals import Refusals
from evq.net.register_broker import (
    DataVersion,
    RegisterBrokerBody,
    RegisterResult,
    body_crc32,
    body_digest,
    kv_table,
)
from evq.net.routes import (
    BROKER_EXPIRED_MS,
    ORDER_TOPIC_CONFIG,
    QueueData,
    Registrant,
    Registration,
    RouteLimits,
    RouteTable,
    TableFull,
    queue_table,
)
from evq.net.tls import ServerTls
from evq.net.transport import (
    Connection,
    Dispatcher,
    Handler,
    RemotingServer,
    TransportConfig,
    settled,
)

log = logs.get_logger(__name__)

DEFAULT_PORT = 9876
SCAN_INTERVAL = 10.0
FIRST_SCAN_DELAY = 5.0
APPLY_TOPIC_URL = "http://rocketmq.apache.org/docs/faq/"

WRITE_CODES: Final = frozenset({
    RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER, RequestCode.PUT_KV_CONFIG,
    RequestCode.DELETE_KV_CONFIG, RequestCode.DELETE_KV_CONFIG_BY_VALUE,
    RequestCode.DELETE_TOPIC_IN_NAMESRV, RequestCode.UPDATE_NAMESRV_CONFIG,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER, RequestCode.ADD_WRITE_PERM_OF_BROKER,
})
"""Requests that change what the name server tells clients: only admins may send them when
an ACL is on.  Codes without a handler yet are listed so that one added later is guarded."""


APPLY_STEP: Final = 5_000
"""Topics of a registration counted or stored in one turn of the loop: about 3 ms of it
(10 ms at worst, on two busy cores), a table of a million topics in 400 steps.  The longest
steps of a new table at the bound are its two million-entry dicts growing (50 ms or more
each, one C call), which no step size splits."""

LARGE_BODIES_AT_ONCE: Final = 2
"""Registrations of a large body (:data:`~evq.net.execution.LARGE_WORK` bytes or more) decoded
or applied at once; the rest wait with their bodies undecoded.  A body may inflate to 64 MiB
of JSON, a few hundred MB of topic configs, and without this as many were decoded at once as
the default executor has threads (up to 32), each then waiting its turn to apply: one client
pipelining large registrations held that many tables.  Two keep one decoding while one
applies; heartbeats of an unchanged small table never wait here."""

_FREED_AT_ONCE: Final = 10_000
"""Decoded topic configs freed in one call (about 1 ms)."""
_TOPIC_NAME_BYTES: Final = 32
"""About what a topic name takes in a topic list, to size the work of building one."""
_TOPIC_LIST_NONE: Final = fastjson.dumps({"topicList": []}).encode()


def _topic_list(names: list[str]) -> bytes:
    """A topic list's answer body (TopicList), its names in no order, as Java's set gives
    them (evq's admin sorts them): a sort of a million names is one call that holds the GIL,
    and the loop with it, for most of a second."""
    return fastjson.dumps({"topicList": names}).encode()


def _decoded(body: bytes, *, compressed: bool, version: int, broker_name: str,
             broker_id: int) -> tuple[DataVersion | None, dict[str, QueueData]]:
    """A REGISTER_BROKER body as the route table takes it: its DataVersion and the queue data
    of its topics (:func:`~evq.net.routes.queue_table`).  A large one is built in a worker
    thread, which gives the loop the GIL in turns, but only between bytecodes: so with the
    cycle collector paused (the objects it makes would set off full collections, each one C
    call walking them all), and the topic configs freed a slice at a time (a million freed at
    once is one C call of 0.1 s)."""
    with execution.collector_paused():
        decoded = RegisterBrokerBody.decode(body, compressed=compressed, version=version)
        queues = queue_table(broker_name, broker_id, decoded.topics)
        data_version, topics = decoded.data_version, list(decoded.topics)
        del decoded
        while topics:
            del topics[-_FREED_AT_ONCE:]
    return data_version, queues


async def _cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it ends."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def no_route_remark(topic: str) -> str:
    """Java's TOPIC_NOT_EXIST remark, FAQ pointer included (clients show it to users)."""
    return (f"No topic route info in name server for the topic: {topic}"
            f"\nSee {APPLY_TOPIC_URL} for further details.")


class NameServer:
    """A name server on ``host:port`` (port 0 picks a free one; ``port`` is the bound one
    after :meth:`start`).  ``routes`` is its table, for embedding and inspection; ``limits``
    its bounds (the defaults of :class:`RouteLimits` unless given)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        clock: Clock = SYSTEM_CLOCK,
        scan_interval: float = SCAN_INTERVAL,
        first_scan_delay: float = FIRST_SCAN_DELAY,
        broker_expiry_ms: int = BROKER_EXPIRED_MS,
        config: TransportConfig | None = None,
        acl_file: Path | None = None,
        tls: ServerTls | None = None,
        limits: RouteLimits | None = None,
    ) -> None:
        self.routes = RouteTable(limits)
        self._registering = asyncio.Lock()
        """Held while a registration applies its table: one at a time, as each counts the
        topics it adds against the bound before the loop turns (:class:`Registering`)."""
        self._large_bodies = asyncio.Semaphore(LARGE_BODIES_AT_ONCE)
        """Held by a registration of a large body from its decoding to the end of its apply
        (see :data:`LARGE_BODIES_AT_ONCE`)."""
        self._topic_lists: dict[str | None, tuple[int, asyncio.Future[bytes]]] = {}
        """Topic list answers by cluster (None: every topic), with the listing version they
        were built at (see :meth:`topic_list_body`)."""
        self.refusals = {
            setting: Refusals("namesrv_table_full", bound, clock, setting=setting)
            for setting, bound in self.routes.limits.bounds().items()}
        """Writes refused at each bound, by its setting name (``maxBrokerAddresses``)."""
        self._acl_file = acl_file
        self.acl: AclFile | None = None
        """The accounts whose admins may write here, once started; None leaves writes open
        (RocketMQ)."""
        self._watcher: asyncio.Task[None] | None = None
        self._refusals = RefusalLog("namesrv_write_refused")
        self._clock = clock
        self._scan_interval = scan_interval
        self._first_scan_delay = first_scan_delay
        self._broker_expiry_ms = broker_expiry_ms
        self._watched: set[Connection] = set()  # connections brokers registered over
        self.bodies_decoded = 0
        """REGISTER_BROKER bodies decoded: not a heartbeat's whose body is the one last applied
        for its address (:func:`~evq.net.register_broker.body_digest`)."""
        self._scanner: asyncio.Task[None] | None = None
        self._leaver: asyncio.Task[None] | None = None  # see _go_on_leaving
        handlers: dict[int, Handler] = {
            RequestCode.PUT_KV_CONFIG: self._put_kv_config,
            RequestCode.GET_KV_CONFIG: self._get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self._delete_kv_config,
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._get_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self._get_kv_list,
            RequestCode.GET_TOPICS_BY_CLUSTER: self._get_topics_by_cluster,
        }
        if acl_file is not None:
            handlers = {code: self._admin_only(h) if code in WRITE_CODES else h
                        for code, h in handlers.items()}
        self._server = RemotingServer(host, port, Dispatcher(handlers, eager=True), config=config,
                                      clock=clock, tls=tls)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def address(self) -> str:
        return self._server.address

    async def start(self) -> None:
        """Load the ACL file (if any), listen, and start the expiry scan.  Raises AclFileError
        when the ACL file cannot be read or is not valid, OSError when the port is taken."""
        if self._acl_file is not None:
            self.acl = await AclFile.open(self._acl_file)
            self._watcher = asyncio.get_running_loop().create_task(self.acl.watch())
        await self._server.start()
        self._scanner = asyncio.get_running_loop().create_task(self._scan_forever())

    async def shutdown(self, grace: float = 10.0) -> None:
        await _cancelled(self._scanner)
        self._scanner = None
        await self._server.shutdown(grace)
        # After the connections closed: each close may have left a broker's topics to drop.
        await _cancelled(self._leaver)
        await _cancelled(self._watcher)
        self._leaver = self._watcher = None

    async def __aenter__(self) -> NameServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def scan(self) -> list[str]:
        """Drop the brokers silent for longer than the expiry; their addresses."""
        gone = self.routes.expire(self._clock.now_ms(), self._broker_expiry_ms, APPLY_STEP)
        self._go_on_leaving()
        return gone

    def _go_on_leaving(self) -> None:
        """Drop the queue data brokers that went left behind (:attr:`RouteTable.leaving`)
        :data:`APPLY_STEP` topics at a time, the loop turning between steps, as a
        registration is applied: a broker leaving a million topics held the loop 0.8-1.4 s
        when they were dropped in one call, and one client may register such a table and
        close its connection again and again."""
        if self.routes.leaving and (self._leaver is None or self._leaver.done()):
            self._leaver = asyncio.get_running_loop().create_task(self._drop_leaving())

    async def _drop_leaving(self) -> None:
        while not self.routes.step_leaving(APPLY_STEP):
            await asyncio.sleep(0)

    async def _scan_forever(self) -> None:
        await asyncio.sleep(self._first_scan_delay)
        while True:
            self.scan()
            await asyncio.sleep(self._scan_interval)

    def _connection_closed(self, conn: Connection) -> None:
        self._watched.discard(conn)
        for addr in self.routes.channel_closed(conn, APPLY_STEP):
            log.info("broker_connection_closed", addr=addr, peer=conn.peer)
        self._go_on_leaving()

    def _admin_only(self, handler: Handler) -> Handler:
        """``handler``, run only for a request an admin account of the ACL file signed."""

        async def guarded(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
            assert self.acl is not None  # loaded before the server listens
            decision = await decide(self.acl.config, conn.peer, cmd)
            if isinstance(decision, Deny):
                self._refusals.refused(conn, cmd, decision)
                raise BrokerError(ResponseCode.NO_PERMISSION, decision.reason)
            return await settled(handler(conn, cmd))

        return guarded

    # --- brokers ------------------------------------------------------------------------------

    async def _register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = RegisterBrokerRequest.read(cmd.ext_fields)
        if h.body_crc32 != 0 and h.body_crc32 != body_crc32(cmd.body):
            log.warning("register_crc_mismatch", peer=conn.peer, broker=h.broker_addr)
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        digest = await execution.sized(len(cmd.body), functools.partial(
            body_digest, cmd.body, compressed=h.compressed, version=cmd.version))
        who = Registrant(cluster=h.cluster_name, broker_name=h.broker_name,
                         broker_addr=h.broker_addr, broker_id=h.broker_id,
                         ha_server_addr=h.ha_server_addr, now_ms=self._clock.now_ms(),
                         channel=conn, body_digest=digest)
        if conn not in self._watched:  # before the table is applied: a close drops it
            self._watched.add(conn)
            conn.add_close_callback(self._connection_closed)
        reg = self.routes.refresh(who)  # the last body again: a heartbeat, left undecoded
        if reg is None:
            self.bodies_decoded += 1
            large = len(cmd.body) >= execution.LARGE_WORK
            async with self._large_bodies if large else contextlib.nullcontext():
                data_version, queues = await execution.sized(len(cmd.body), functools.partial(
                    _decoded, cmd.body, compressed=h.compressed, version=cmd.version,
                    broker_name=h.broker_name, broker_id=h.broker_id))
                who = attrs.evolve(who, now_ms=self._clock.now_ms(), data_version=data_version)
                reg = self.routes.refresh(who)
                if reg is None:
                    try:
                        reg = await self._apply(who, queues)
                    except TableFull as exc:
                        self.refusals[exc.setting].refuse(peer=conn.peer, broker=h.broker_name,
                                                          addr=h.broker_addr)
                        raise
        result = RegisterResult(master_addr=reg.master_addr, master_ha_addr=reg.ha_server_addr,
                                order_topic_config=self.routes.kv_list(ORDER_TOPIC_CONFIG))
        return cmd.response(fields=result.fields(), body=result.body())

    async def _apply(self, who: Registrant, queues: dict[str, QueueData]) -> Registration:
        """Apply a registration :data:`APPLY_STEP` topics at a time, letting the loop turn
        between steps, after the registrations before it."""
        async with self._registering:
            registering = self.routes.start_register(who, queues)
            while not registering.step(APPLY_STEP):
                await asyncio.sleep(0)
        assert registering.result is not None
        return registering.result

    async def _unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = UnRegisterBrokerRequest.read(cmd.ext_fields)
        self.routes.unregister(cluster=h.cluster_name, broker_name=h.broker_name,
                               broker_addr=h.broker_addr, broker_id=h.broker_id,
                               most=APPLY_STEP)
        self._go_on_leaving()
        return cmd.response()

    # --- routes and topics ------------------------------------------------------------------

    async def _get_route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = GetRouteInfoRequest.read(cmd.ext_fields).topic
        route = self.routes.route(topic)
        if route is None:
            raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, no_route_remark(topic))
        return cmd.response(body=fastjson.dumps(route).encode())

    async def _get_cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=fastjson.dumps(self.routes.cluster_info()).encode())

    async def _get_topic_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=await self.topic_list_body())

    async def _get_topics_by_cluster(self, conn: Connection,
                                     cmd: RemotingCommand) -> RemotingCommand:
        h = GetTopicsByClusterRequest.read(cmd.ext_fields)
        return cmd.response(body=await self.topic_list_body(h.cluster))

    async def topic_list_body(self, cluster: str | None = None) -> bytes:
        """The answer to a topic list (of ``cluster``'s brokers): built once per
        :attr:`RouteTable.listing_version` and kept, the names copied on the loop and encoded
        in a worker thread when many.  Anyone may ask for it: at the table's bound
        (a million topics) one build took the loop 1.5 s, which a client asking again and
        again would have made the loop's whole time."""
        if cluster is not None and cluster not in self.routes.clusters:
            return _TOPIC_LIST_NONE  # not kept: a client may name any number of clusters
        version = self.routes.listing_version
        kept = self._topic_lists.get(cluster)
        if kept is None or kept[0] != version:
            if kept is None and len(self._topic_lists) > len(self.routes.clusters):
                self._topic_lists = {k: v for k, v in self._topic_lists.items()
                                     if k is None or k in self.routes.clusters}
            names = self.routes.topic_names(cluster)
            kept = version, asyncio.ensure_future(
                execution.sized(len(names) * _TOPIC_NAME_BYTES, _topic_list, names))
            self._topic_lists[cluster] = kept
        return await asyncio.shield(kept[1])

    async def _delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = DeleteTopicFromNamesrvRequest.read(cmd.ext_fields)
        self.routes.delete_topic(h.topic, h.cluster_name)
        log.info("topic_deleted", topic=h.topic, peer=conn.peer)
        return cmd.response()

    # --- KV config --------------------------------------------------------------------------

    async def _put_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = PutKVConfigRequest.read(cmd.ext_fields)
        try:
            self.routes.put_kv(h.namespace, h.key, h.value)
        except TableFull as exc:
            self.refusals[exc.setting].refuse(peer=conn.peer)
            raise
        return cmd.response()

    async def _get_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetKVConfigRequest.read(cmd.ext_fields)
        value = self.routes.get_kv(h.namespace, h.key)
        if value is None:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                              f"No config item, Namespace: {h.namespace} Key: {h.key}")
        return cmd.response(fields=GetKVConfigResponse.write(value=value))

    async def _delete_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = DeleteKVConfigRequest.read(cmd.ext_fields)
        self.routes.delete_kv(h.namespace, h.key)
        return cmd.response()

    async def _get_kv_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        namespace = GetKVListByNamespaceRequest.read(cmd.ext_fields).namespace
        table = self.routes.kv_list(namespace)
        if table is None:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                              f"No config item, Namespace: {namespace}")
        return cmd.response(body=kv_table(table))
