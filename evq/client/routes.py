"""Topic routes from the name servers, and the pooled broker connections they point to.

A route (``TopicRouteData``, §2.3.1 of the wire notes) names, per broker name, its addresses by
broker id (0 = master) and its queue counts and permission.  Producers write to the master of
every writable queue; consumers read every readable queue.  Routes are cached and refreshed
every 30 s; a topic no name server knows is sent through the route of ``TBW102`` (capped to 4
queues a broker, as the C++ client does), and the broker creates it on the first message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import attrs

from evq import logs
from evq.client.errors import BrokerRefused, ClientError, RouteNotFound
from evq.domain import topics as tp
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.codes import ResponseCode
from evq.domain.queues import MessageQueue
from evq.net import fastjson
from evq.net.codes import RequestCode
from evq.net.headers.namesrv import GetRouteInfoRequest
from evq.net.protocol import RemotingCommand
from evq.net.routes import MASTER_ID, QueueData
from evq.net.security import ClientSecurity
from evq.net.transport import (
    Connection,
    Dispatcher,
    RemotingClient,
    TransportError,
    split_address,
)

log = logs.get_logger(__name__)

REFRESH_S: Final = 30.0
DEFAULT_TOPIC_QUEUES: Final = 4
REQUEST_TIMEOUT_S: Final = 3.0


@attrs.frozen(slots=True)
class TopicRoute:
    topic: str
    brokers: dict[str, dict[int, str]]  # broker name -> broker id -> "ip:port"
    queue_datas: tuple[QueueData, ...]
    order_topic_conf: str = ""

    @classmethod
    def from_body(cls, topic: str, body: bytes) -> TopicRoute:
        """Parse a name server's answer; fastjson's unquoted integer keys are accepted."""
        try:
            data = fastjson.loads(body.decode())
            brokers = {str(b["brokerName"]): {int(k): str(v) for k, v in b["brokerAddrs"].items()}
                       for b in data.get("brokerDatas") or []}
            queues = tuple(QueueData(str(q["brokerName"]), int(q["readQueueNums"]),
                                     int(q["writeQueueNums"]), int(q["perm"]),
                                     int(q.get("topicSysFlag") or 0))
                           for q in data.get("queueDatas") or [])
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ClientError(f"unreadable route for topic {topic!r}: {exc!r}") from None
        return cls(topic, brokers, queues, str(data.get("orderTopicConf") or ""))

    def master(self, broker_name: str) -> str | None:
        return self.brokers.get(broker_name, {}).get(MASTER_ID)

    def publish_queues(self) -> list[MessageQueue]:
        """Writable queues on brokers with a master, sorted; ``orderTopicConf`` wins if set."""
        if self.order_topic_conf:
            out = []
            for item in self.order_topic_conf.split(";"):
                name, _, n = item.partition(":")
                out += [MessageQueue(self.topic, name, i) for i in range(int(n or 0))]
            return out
        return sorted(MessageQueue(self.topic, q.broker_name, i)
                      for q in self.queue_datas
                      if q.perm & tp.PERM_WRITE and self.master(q.broker_name)
                      for i in range(q.write_queue_nums))

    def subscribe_queues(self) -> list[MessageQueue]:
        return sorted(MessageQueue(self.topic, q.broker_name, i)
                      for q in self.queue_datas if q.perm & tp.PERM_READ
                      for i in range(q.read_queue_nums))

    def as_default_for(self, topic: str) -> TopicRoute:
        """The ``TBW102`` route lent to a topic not created yet, capped as the C++ client does."""
        capped = tuple(attrs.evolve(q, read_queue_nums=min(DEFAULT_TOPIC_QUEUES, q.read_queue_nums),
                                    write_queue_nums=min(DEFAULT_TOPIC_QUEUES, q.write_queue_nums))
                       for q in self.queue_datas)
        return TopicRoute(topic, self.brokers, capped)


def parse_addresses(namesrv: str) -> list[tuple[str, int]]:
    """``"h:p;h:p"`` into pairs; a clear error for anything else."""
    out = [split_address(item) for item in filter(None, (s.strip() for s in namesrv.split(";")))]
    if not out:
        raise ValueError("no name server address given")
    return out


class BrokerPool:
    """One connection per broker address, shared by everything a client process runs there.

    ``dispatcher`` answers the requests brokers send to clients (NOTIFY_CONSUMER_IDS_CHANGED).
    ``security`` (credentials, TLS) applies to every connection, slaves' included.
    """

    def __init__(self, dispatcher: Dispatcher | None = None, clock: Clock = SYSTEM_CLOCK, *,
                 security: ClientSecurity | None = None) -> None:
        self.dispatcher = dispatcher or Dispatcher()
        self.security = security
        self._clock = clock
        self._clients: dict[str, RemotingClient] = {}
        self._open: dict[str, Connection] = {}
        """The open connection of each address: a request on it goes straight out, without
        a call through the address's client."""

    def client(self, addr: str) -> RemotingClient:
        client = self._clients.get(addr)
        if client is None:
            (host, port), = parse_addresses(addr)
            client = RemotingClient(host, port, self.dispatcher, clock=self._clock,
                                    security=self.security)
            self._clients[addr] = client
        return client

    @property
    def addresses(self) -> list[str]:
        return sorted(self._clients)

    def invoke(self, addr: str, cmd: RemotingCommand,
               timeout: float = REQUEST_TIMEOUT_S) -> Awaitable[RemotingCommand]:
        """The answer to ``cmd`` from ``addr``, to await.  On an open connection this is the
        connection's own request: a coroutine of this method's around it was one more frame
        every answer passed through on its way to the caller."""
        conn = self.opened(addr)
        if conn is None:
            return self._invoke_opening(addr, cmd, timeout)
        return conn.send_request(cmd, timeout)

    async def _invoke_opening(self, addr: str, cmd: RemotingCommand,
                              timeout: float) -> RemotingCommand:
        return await (await self.connect(addr)).send_request(cmd, timeout)

    def opened(self, addr: str) -> Connection | None:
        """The open connection to ``addr``, if there is one (what a request goes out on
        without awaiting anything first)."""
        conn = self._open.get(addr)
        return None if conn is None or conn.is_closed else conn

    async def connect(self, addr: str) -> Connection:
        """The connection to ``addr``, opened if there is none; raises a
        :class:`TransportError`."""
        conn = self._open[addr] = await self.client(addr).connection()
        return conn

    async def call(self, addr: str, cmd: RemotingCommand, what: str,
                   timeout: float = REQUEST_TIMEOUT_S,
                   ok: Iterable[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """:meth:`invoke`, raising :class:`BrokerRefused` for an answer not in ``ok``."""
        answer = await self.invoke(addr, cmd, timeout)
        if answer.code not in tuple(ok):
            raise BrokerRefused(answer.code, answer.remark, f"{what} at {addr}")
        return answer

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        self._open = {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


class Routes:
    """The route cache of one client: looked up on first use, refreshed by :meth:`refresh`.
    ``security`` applies to the name server connections (a name server with an ACL checks
    only writes, but a signed lookup costs nothing and TLS may be required)."""

    def __init__(self, namesrv: str, clock: Clock = SYSTEM_CLOCK, *,
                 security: ClientSecurity | None = None) -> None:
        self._namesrv = [RemotingClient(h, p, clock=clock, security=security)
                         for h, p in parse_addresses(namesrv)]
        self._next = 0
        self._routes: dict[str, TopicRoute] = {}
        self.cached: Callable[[str], TopicRoute | None] = self._routes.get
        """The cached route of a topic, if any: what a send or pull checks first without
        awaiting (the cache's own ``get``: every send asks, and a method around it was one
        more Python frame each time)."""

    @property
    def topics(self) -> list[str]:
        return sorted(self._routes)

    async def route(self, topic: str, *, fallback: bool = False) -> TopicRoute:
        """The cached route, looked up when missing; ``fallback`` lends TBW102's route to a
        topic no name server knows (producers only: consumers have nothing to read yet)."""
        route = self._routes.get(topic)
        if route is None:
            try:
                route = await self.lookup(topic)
            except RouteNotFound:
                if not fallback:
                    raise
                # Kept until a refresh finds the route the broker registers on creation.
                route = (await self.route(tp.AUTO_CREATE_TOPIC)).as_default_for(topic)
            self._routes[topic] = route
        return route

    async def lookup(self, topic: str) -> TopicRoute:
        """The route as the name servers know it now (not cached)."""
        answer = await self.ask(RemotingCommand.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequest.write(topic=topic)),
            f"topic {topic!r}")
        if answer.code == ResponseCode.TOPIC_NOT_EXIST:
            raise RouteNotFound(f"no route for topic {topic!r}: {answer.remark}")
        if answer.code != ResponseCode.SUCCESS:
            raise BrokerRefused(answer.code, answer.remark, f"route of {topic!r}")
        return TopicRoute.from_body(topic, answer.body)

    async def ask(self, cmd: RemotingCommand, what: str) -> RemotingCommand:
        """Ask the name servers in turn (the next one after a transport failure); the
        answer, whatever its code."""
        last: Exception | None = None
        failures: dict[str, str] = {}
        for _ in self._namesrv:
            client = self._namesrv[self._next % len(self._namesrv)]
            try:
                return await client.invoke(attrs.evolve(cmd), REQUEST_TIMEOUT_S)
            except TransportError as exc:
                log.warning("name server unreachable", addr=client.address, error=str(exc))
                self._next += 1
                last = exc
                failures[client.address] = str(exc)
        # Each server's own failure: refused, timed out, a TLS certificate rejected...
        tried = "; ".join(f"{addr}: {why}" for addr, why in failures.items())
        raise ClientError(f"no name server reachable for {what} (tried {tried})") from last

    async def refresh(self) -> None:
        """Look every cached topic up again; a topic whose lookup fails keeps its old route."""
        for topic in self.topics:
            try:
                self._routes[topic] = await self.lookup(topic)
            except ClientError as exc:
                log.warning("route refresh failed", topic=topic, error=str(exc))

    def forget(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def masters(self) -> list[str]:
        """Every master address of every cached route (where heartbeats go)."""
        return sorted({addr for r in self._routes.values() for ids in r.brokers.values()
                       for i, addr in ids.items() if i == MASTER_ID})

    def all_addresses(self) -> list[str]:
        """Every broker address, masters and slaves, of every cached route."""
        return sorted({addr for r in self._routes.values() for ids in r.brokers.values()
                       for addr in ids.values()})

    def master(self, broker_name: str) -> str | None:
        for route in self._routes.values():
            if (addr := route.master(broker_name)) is not None:
                return addr
        return None

    def group_addresses(self, broker_name: str) -> dict[int, str]:
        """Every known address of a broker group, by broker id, over all cached routes."""
        out: dict[int, str] = {}
        # A snapshot, taken in one step: a caller's thread may ask while the loop routes.
        for route in tuple(self._routes.values()):
            out.update(route.brokers.get(broker_name, {}))
        return out

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._namesrv), return_exceptions=True)
