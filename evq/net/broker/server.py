"""``evq broker``: the domain broker behind a RocketMQ remoting server.

Start-up binds the port first, so that the store host written into every record (and so every
offset msgId, and the address C++ clients send CONSUMER_SEND_MSG_BACK to) is the real
client-facing ``ip:port`` even when the port was 0; then it opens the store (recovering it),
registers the processors, and only then listens: while the store opens, connections are
refused (clients retry), never answered REQUEST_CODE_NOT_SUPPORTED (which stock producers do
not retry).  Shutdown answers in-flight requests, releases parked pulls, flushes the store and
removes its abort marker.

TLS settings (``tls.*``) apply to both of its ports, the remoting port and the HA port, and
(``tls.enable``) to every connection it opens itself: registration with the name servers, a
slave's HA link and the offsets it hands back to its master.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

import attrs

from evq import logs
from evq.domain.broker_config import BrokerRole
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.log import FlushMode
from evq.domain.membership import GroupMembership
from evq.domain.message import Message, Prop
from evq.domain.record import encode, offset_msg_id
from evq.embedded import Broker as Engine
from evq.ha.master import HAMaster
from evq.ha.slave import HASlave
from evq.net.acl_check import RefusalLog
from evq.net.acl_file import AclFile
from evq.net.broker import admin, clients, pull, queries, send
from evq.net.broker.acl import acl_checked
from evq.net.broker.context import BrokerContext
from evq.net.broker.names import names_checked
from evq.net.broker.stats import BrokerStats
from evq.net.codes import RequestCode
from evq.net.durable import DurableWaker
from evq.net.headers.offsets import UpdateConsumerOffsetRequest
from evq.net.headers.transactions import CheckTransactionStateRequest
from evq.net.long_polling import PullHolds
from evq.net.protocol import RemotingCommand
from evq.net.register_broker import BrokerIdentity
from evq.net.registration import BrokerRegistrar
from evq.net.security import ClientSecurity
from evq.net.transport import (
    Connection,
    Dispatcher,
    RemotingClient,
    RemotingServer,
    TransportConfig,
    TransportError,
    split_address,
)
from evq.settings import Settings

log = logs.get_logger(__name__)

MEMBERSHIP_SCAN_S = 10.0
HAND_BACK_S = 5.0
PROCESSOR_MODULES = (send, pull, clients, queries, admin)


def physical_memory() -> int:
    """This machine's RAM: how much of the log the page cache can hold, which decides when a
    pull is far enough behind to be sent to a slave (``accessMessageInMemoryMaxRatio``)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@attrs.define(slots=True)
class CheckBack:
    """The transaction checker's port: CHECK_TRANSACTION_STATE to one live producer of the
    group.  The checker runs on the broker's tick thread, so the send hops to the loop."""

    ctx: BrokerContext

    def check_back(self, producer_group: str, half: Message) -> bool:
        conn = self.ctx.membership.producer_connection(producer_group)
        if not isinstance(conn, Connection) or conn.is_closed:
            return False
        real = attrs.evolve(half, topic=half.properties.get(Prop.REAL_TOPIC, half.topic),
                            queue_id=int(half.properties.get(Prop.REAL_QID, "0") or 0))
        uniq = half.properties.get(Prop.UNIQ_KEY, "")
        fields = CheckTransactionStateRequest.write(
            tran_state_table_offset=half.queue_offset, commit_log_offset=half.commit_log_offset,
            msg_id=uniq, transaction_id=half.properties.get(Prop.TRANSACTION_ID, uniq),
            offset_msg_id=offset_msg_id(half.store_host, half.commit_log_offset))
        request = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, fields,
                                          bytes(encode(real)), oneway=True)
        self.ctx.loop.call_soon_threadsafe(conn.send_oneway, request)
        return True


class ListenError(OSError):
    """A port the broker could not listen on other than its remoting port (the HA port): the
    error names the address it tried, where the bind error alone would leave a reader to
    guess which of the broker's ports it was."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.host, self.port = host, port


class BrokerServer:
    def __init__(self, settings: Settings, *, clock: Clock = SYSTEM_CLOCK,
                 transport: TransportConfig | None = None) -> None:
        self.settings = settings
        self._clock = clock
        self._dispatcher = Dispatcher(eager=True)
        self._server_tls = settings.tls.server()
        self._client_tls = settings.tls.client()
        credentials = settings.net.credentials
        self.security = (ClientSecurity(credentials, self._client_tls)
                         if credentials is not None or self._client_tls is not None else None)
        """What the broker's own outgoing connections carry (name servers, its master): its
        own account's signature and TLS, each when configured."""
        self.server = RemotingServer(
            settings.net.host, settings.net.listen_port, self._dispatcher,
            config=transport or TransportConfig(
                max_connections=settings.net.max_connections,
                max_buffered_bytes=settings.net.max_buffered_bytes),
            clock=clock, tls=self._server_tls)
        self.ctx: BrokerContext | None = None
        self.registrar: BrokerRegistrar | None = None
        self.ha_master: HAMaster | None = None
        self.ha_slave: HASlave | None = None
        self.acl: AclFile | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closers: list[Callable[[], None]] = []

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def ha_address(self) -> str | None:
        """Where this (master) broker takes slaves; None when it does not."""
        return self.ha_master.address if self.ha_master is not None else None

    async def start(self) -> None:
        """Bind, open (and recover) the store, then listen.  Raises OSError when the port is
        taken, :class:`evq.domain.log.StoreUnavailable` (not an OSError, so that it is never
        reported as a port that cannot be bound) when the data dir cannot be opened, and
        :class:`evq.domain.log.LogLocked` when another broker has the data dir, and
        :class:`evq.acl.accounts.AclFileError` when ACL is on and its file cannot be used
        (refusing to start beats serving everyone, or no one, unchecked)."""
        if self.settings.net.acl_enable:
            self.acl = await AclFile.open(self.settings.net.acl_path)
        await self.server.start(serving=False)
        try:
            await self._open()
        except BaseException:
            await self.server.shutdown(grace=0)
            raise

    async def _open(self) -> None:
        s = self.settings
        host = (s.net.host, self.server.port)
        broker_config = attrs.evolve(s.broker, store_host=host,
                                     total_memory_bytes=physical_memory())
        store_config = attrs.evolve(s.store, store_host=host)
        engine = await asyncio.to_thread(
            Engine.open, s.net.store_path_root_dir, s.net.backend, store_config=store_config,
            broker_config=broker_config, metadata=s.net.metadata_url or None, clock=self._clock)
        loop = asyncio.get_running_loop()
        engine.core.declare_event_loop_thread()
        holds = PullHolds(loop)
        self._closers.append(holds.listen(engine.core.log))
        durable = (DurableWaker(loop, engine.core.log, store_config.sync_flush_timeout_ms / 1000)
                   if store_config.flush is FlushMode.SYNC_FLUSH else None)
        ctx = BrokerContext(engine, GroupMembership(clock=self._clock), holds, loop,
                            durable=durable, stats=BrokerStats(boot_ms=self._clock.now_ms()),
                            refusals=self.server.refusals, read_budget=self.server.budget)
        engine.transactions.port = CheckBack(ctx)
        refusals = RefusalLog("acl_refused")
        for module in PROCESSOR_MODULES:
            for code, handler in module.handlers(ctx).items():
                checked = names_checked(code, handler)
                self._dispatcher.register(code, checked if self.acl is None
                                          else acl_checked(checked, self.acl, refusals))
        self.ctx = ctx
        if self.acl is not None:
            self._tasks.append(loop.create_task(self.acl.watch()))
        self._tasks.append(loop.create_task(self._scan_members()))
        self._tasks.append(loop.create_task(ctx.loop_lag.run()))
        self._tasks.append(loop.create_task(ctx.stats.sample_forever(self._clock)))
        await self._start_ha(ctx)
        await self.server.start_serving()  # ready: only now may a name server route here
        if s.net.namesrv_list:
            # Registered at once rather than RocketMQ's 10 s in: a client started with the
            # broker would otherwise find no route for its first sends.
            self.registrar = BrokerRegistrar(
                s.net.namesrv_list,
                BrokerIdentity(cluster=s.broker.broker_cluster_name,
                               broker_name=s.broker.broker_name, broker_id=s.broker.broker_id,
                               broker_addr=self.address,
                               ha_server_addr=self.ha_address or ""),
                lambda: engine.core.topics().values(), clock=self._clock, first_delay=0.0,
                security=self.security)
            ctx.topics_changed = self.registrar.register_now
            await self.registrar.start()
        log.info("broker_started", address=self.address, backend=s.net.backend,
                 data=s.net.store_path_root_dir, role=s.broker.broker_role.value)

    async def _start_ha(self, ctx: BrokerContext) -> None:
        """A master listens for slaves (a SYNC_MASTER's sends then wait for one); a slave
        follows the master named in its settings or, failing that, by the name servers."""
        s = self.settings
        message_log = ctx.core.log
        if s.broker.is_slave:
            self.ha_slave = HASlave(message_log, self._master_ha_addr,
                                    on_streaming=self._hand_back_offsets,
                                    truncate=ctx.core.truncate_log,
                                    credentials=s.net.credentials, tls=self._client_tls)
            self.ha_slave.start()
            return
        acl = self.acl
        master = HAMaster(message_log, s.net.host, s.net.ha_port,
                          accounts=(lambda: acl.config) if acl is not None else None,
                          tls=self._server_tls)
        try:
            await master.start()
        except OSError as exc:
            # Only a broker that needs slaves fails for want of the port; others serve on.
            if s.broker.broker_role is BrokerRole.SYNC_MASTER or s.net.ha_listen_port:
                raise ListenError(s.net.host, s.net.ha_port, exc) from exc
            log.warning("ha_port_unavailable", port=s.net.ha_port, error=str(exc))
            return
        self.ha_master = master
        if s.broker.broker_role is BrokerRole.SYNC_MASTER:
            ctx.replicated = master.wait_replicated

    async def _hand_back_offsets(self) -> None:
        """While a slave streams, it gives its master the offsets consumers committed here
        (while the master was down, or before they noticed it was back), every few seconds.
        The master keeps those ahead of its own and records them; a pending commit here ends
        when that record replicates back (:meth:`evq.domain.broker.Broker.local_commits`)."""
        assert self.ctx is not None and self.ha_slave is not None
        core = self.ctx.core
        while self.ha_slave.streaming:
            commits = core.local_commits()
            master = self.registrar.master_addr if self.registrar is not None else None
            if commits and master is not None:
                await self._send_offsets(master, commits)
            await asyncio.sleep(HAND_BACK_S)

    async def _send_offsets(self, master: str, commits: dict[tuple[str, str, int], int]
                            ) -> None:
        try:
            async with RemotingClient(*split_address(master), clock=self._clock,
                                      security=self.security) as client:
                for (group, topic, queue_id), offset in commits.items():
                    await client.invoke(RemotingCommand.request(
                        RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequest.write(
                            consumer_group=group, topic=topic, queue_id=queue_id,
                            commit_offset=offset, take_if_newer=True)), HAND_BACK_S)
        except TransportError as exc:
            log.warning("offsets_not_handed_back", master=master, error=str(exc))
            return
        log.info("offsets_handed_back", master=master, offsets=len(commits))

    def _master_ha_addr(self) -> str | None:
        configured = self.settings.net.master_ha_addr
        if configured:
            return configured
        return self.registrar.master_ha_addr if self.registrar is not None else None

    async def _scan_members(self) -> None:
        """Drop clients silent for 120 s, every 10 s, as RocketMQ's ClientHousekeepingService."""
        assert self.ctx is not None
        while True:
            await asyncio.sleep(MEMBERSHIP_SCAN_S)
            expired = self.ctx.membership.scan_expired()
            for conn in expired.connections:
                if isinstance(conn, Connection):
                    conn.close()
            clients.notify_ids_changed(self.ctx, expired.groups)

    async def shutdown(self, grace: float = 10.0) -> None:
        if self.registrar is not None:
            await self.registrar.shutdown()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.ctx is not None:
            self.ctx.holds.release_all()
        if self.ha_slave is not None:
            await self.ha_slave.shutdown()
        await self.server.shutdown(grace)
        if self.ha_master is not None:
            await self.ha_master.shutdown()
        for close in self._closers:
            close()
        if self.ctx is not None:
            await asyncio.to_thread(self.ctx.engine.close)
            self.ctx = None
        log.info("broker_stopped", address=self.address)

    async def __aenter__(self) -> BrokerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
