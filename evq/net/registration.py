"""The broker's side of the name servers: register with every one, stay registered, leave.

A name server forgets a broker 120 s after its last registration, so a broker registers with
every name server 10 s after start, then every 30 s, and at once after a topic change (a
client that just had a topic auto-created looks its route up next).  Each name server has its
own loop and connection: one that is down or slow costs its own loop a timeout and delays no
other.  Name servers answer a slave with its master's address and HA address, which
:class:`BrokerRegistrar` keeps for the HA layer; on shutdown the broker unregisters, so clients
stop being routed to it before its expiry would tell them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from evq import logs
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.topics import TopicConfig
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.register_broker import (
    BrokerIdentity,
    DataVersion,
    RegisterBrokerBody,
    RegisterResult,
    body_crc32,
)
from evq.net.security import ClientSecurity
from evq.net.transport import RemotingClient, TransportConfig, TransportError, split_address

log = logs.get_logger(__name__)

FIRST_DELAY = 10.0
PERIOD = 30.0  # registerNameServerPeriod
TIMEOUT = 6.0  # registerBrokerTimeoutMills


@attrs.define(slots=True)
class _Link:
    """One name server: its connection, its loop, and what it last answered."""

    addr: str
    client: RemotingClient
    wake: asyncio.Event = attrs.field(factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    last: RegisterResult | None = None


class BrokerRegistrar:
    """Keeps one broker registered with every name server in ``namesrv_addrs``.

    ``topics`` is called at each registration for the broker's current topic table.
    ``first_delay`` and ``period`` are seconds (Java: 10 and 30); tests pass about 0 for the
    first.  The clock stamps the topic table's DataVersion.  ``security`` signs registrations
    with the broker's own account, which a name server with an ACL requires.
    """

    def __init__(
        self,
        namesrv_addrs: Sequence[str],
        identity: BrokerIdentity,
        topics: Callable[[], Iterable[TopicConfig]],
        *,
        clock: Clock = SYSTEM_CLOCK,
        first_delay: float = FIRST_DELAY,
        period: float = PERIOD,
        timeout: float = TIMEOUT,
        compressed: bool = False,
        config: TransportConfig | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.identity = identity
        self._topics = topics
        self._clock = clock
        self._first_delay = first_delay
        self._period = period
        self._timeout = timeout
        self._compressed = compressed
        self._links = {
            addr: _Link(addr, RemotingClient(*split_address(addr), config=config, clock=clock,
                                             security=security))
            for addr in namesrv_addrs
        }
        self._data_version = DataVersion(clock.now_ms(), 0)
        self._table: tuple[TopicConfig, ...] = ()
        """The topic table :attr:`_data_version` stands for."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.master_addr: str | None = None
        """The master's address, once a name server told this (slave) broker."""
        self.master_ha_addr: str | None = None
        """Where the master takes replication connections, likewise."""
        self.order_topic_config: Mapping[str, str] | None = None
        """The name servers' ``ORDER_TOPIC_CONFIG`` table, as last answered."""

    @property
    def namesrv_addrs(self) -> list[str]:
        return list(self._links)

    def last_result(self, namesrv_addr: str) -> RegisterResult | None:
        """What that name server answered last; None before its first successful answer."""
        return self._links[namesrv_addr].last

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        for link in self._links.values():
            link.task = loop.create_task(self._keep_registered(link))

    def register_now(self) -> None:
        """Register with every name server now: call it after the topic table changed (a
        changed table goes with a new DataVersion whether this is called or not, at the next
        period at the latest).  Safe from any thread; before :meth:`start` there is nothing to
        do, the first registration carries the table as it is then."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._topics_changed)

    async def shutdown(self) -> None:
        """Stop registering, unregister from every name server (each bounded by the
        timeout), close the connections."""
        tasks = [link.task for link in self._links.values() if link.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._unregister(link) for link in self._links.values()))
        for link in self._links.values():
            link.task = None
            await link.client.close()
        self._loop = None

    async def __aenter__(self) -> BrokerRegistrar:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def _topics_changed(self) -> None:
        for link in self._links.values():
            link.wake.set()

    async def _keep_registered(self, link: _Link) -> None:
        delay = self._first_delay
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await link.wake.wait()
            link.wake.clear()  # a change from now on asks for another round
            try:
                await self._register(link)
            except Exception:  # the broker's topic source failed; try again next period
                log.exception("register_failed", namesrv=link.addr)
            delay = self._period

    async def _register(self, link: _Link) -> None:
        topics = tuple(self._topics())
        # A name server applies a table only when its version moved, so the version moves
        # with every change, announced or not (a DLQ topic a consumer's send-back made is
        # not).  Configs left alone are the same objects, compared by identity at C speed.
        if topics != self._table:
            self._table = topics
            self._data_version = DataVersion(self._clock.now_ms(),
                                             self._data_version.counter + 1)
        body = RegisterBrokerBody(topics=topics,
                                  data_version=self._data_version).encode(self._compressed)
        fields = self.identity.register_fields(body_crc32=body_crc32(body),
                                               compressed=self._compressed)
        request = RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body)
        try:
            answer = await link.client.invoke(request, self._timeout)
            if answer.code != ResponseCode.SUCCESS:
                log.warning("register_refused", namesrv=link.addr, code=answer.code,
                            remark=answer.remark)
                return
            result = RegisterResult.from_response(answer)
        except (TransportError, BrokerError) as exc:
            log.warning("register_failed", namesrv=link.addr, error=str(exc))
            return
        if link.last is None:
            log.info("registered", namesrv=link.addr, broker=self.identity.broker_addr)
        link.last = result
        self._learn(result)

    def _learn(self, result: RegisterResult) -> None:
        # Only an answer that names a master moves these: a name server that does not know
        # the master yet (just restarted, master not registered there) must not erase what
        # another one said.
        if result.master_addr is not None and result.master_addr != self.master_addr:
            log.info("master_learnt", master=result.master_addr, ha=result.master_ha_addr)
            self.master_addr = result.master_addr
        if result.master_ha_addr is not None:
            self.master_ha_addr = result.master_ha_addr
        if result.order_topic_config is not None:
            self.order_topic_config = result.order_topic_config

    async def _unregister(self, link: _Link) -> None:
        request = RemotingCommand.request(RequestCode.UNREGISTER_BROKER,
                                          self.identity.unregister_fields())
        try:
            answer = await link.client.invoke(request, self._timeout)
        except TransportError as exc:
            log.warning("unregister_failed", namesrv=link.addr, error=str(exc))
            return
        if answer.code != ResponseCode.SUCCESS:
            log.warning("unregister_refused", namesrv=link.addr, code=answer.code,
                        remark=answer.remark)
