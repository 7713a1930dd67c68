"""The push consumer: rebalanced queues, long-polling pulls, a listener called per message.

One task per owned queue pulls (long polling, 15 s hold) into that queue's
:class:`ProcessQueue`; each message is handed to the listener in its own task, at most
``consume_concurrency`` at once; the queue's offset advances to the smallest message still in
flight and is persisted every 5 s and at shutdown.  A listener answering RECONSUME_LATER (or
raising) has the message sent back to the broker (CONSUMER_SEND_MSG_BACK), which redelivers it
through ``%RETRY%<group>`` with ``reconsume_times`` + 1; a failed send-back keeps the message
here and consumes it again after 5 s.  Broadcasting consumers do not retry (RocketMQ drops
the failure) and keep their offsets in a local file.

Members agree on who owns which queue by running :func:`evq.domain.rebalance.allocate` over
the same sorted inputs: every 20 s, and whenever the broker sends NOTIFY_CONSUMER_IDS_CHANGED.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Final

import attrs
import structlog

from evq.client.broker_choice import MASTER_ID, BrokerChoice
from evq.client.errors import ClientError, NotStarted, RouteNotFound
from evq.client.identity import new_client_id
from evq.client.offsets import LocalOffsets, OffsetStore, RemoteOffsets, max_offset
from evq.client.process_queue import ProcessQueue
from evq.client.pulling import (
    LONG_POLL_TIMEOUT_S,
    PullStatus,
    Subscription,
    parse_pull,
    pull_request,
)
from evq.client.routes import REFRESH_S, BrokerPool, Routes
from evq.domain import topics as tp
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.message import Message
from evq.domain.queues import MessageQueue
from evq.domain.rebalance import AllocateStrategy, AllocationError, allocate
from evq.domain.record import offset_msg_id
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Dispatcher, TransportError

log = structlog.get_logger(__name__)

HEARTBEAT_S: Final = 30.0
REBALANCE_S: Final = 20.0
PERSIST_S: Final = 5.0
RETRY_LOCALLY_S: Final = 5.0
SHUTDOWN_GRACE_S: Final = 10.0
PULL_ERROR_BACKOFF_S: Final = 3.0
FLOW_CONTROL_BACKOFF_S: Final = 0.05
MAX_CACHED_MESSAGES: Final = 1000
MAX_CACHED_BYTES: Final = 100 * 1024 * 1024


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(enum.Enum):
    """Where a queue with no stored offset starts."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"


class ConsumeResult(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


Listener = Callable[[list[Message]], Awaitable[ConsumeResult]]


@attrs.frozen(slots=True, kw_only=True)
class ConsumerOptions:
    """Timings and limits; the defaults are the Java client's."""

    heartbeat_s: float = HEARTBEAT_S
    rebalance_s: float = REBALANCE_S
    persist_s: float = PERSIST_S
    route_refresh_s: float = REFRESH_S
    consume_concurrency: int = 20
    max_reconsume_times: int = 16
    retry_delay_level: int = 0
    """Delay level of a sent-back message; 0 lets the broker choose (3 + reconsume times)."""
    strategy: AllocateStrategy | str = "AVG"
    consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET


@attrs.define(slots=True)
class _Owned:
    pq: ProcessQueue
    task: asyncio.Task[None]


class PushConsumer:
    def __init__(self, group: str, namesrv: str, *,
                 model: MessageModel = MessageModel.CLUSTERING,
                 listener: Listener | None = None,
                 options: ConsumerOptions | None = None,
                 client_id: str | None = None,
                 offsets_file: Path | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.group = group
        self.model = model
        self.options = options or ConsumerOptions()
        self.client_id = client_id or new_client_id()
        self._namesrv = namesrv
        self._listener = listener
        self._offsets_file = offsets_file or Path.home() / ".evq" / "offsets" / f"{group}.json"
        self._clock = clock
        self._subs: dict[str, Subscription] = {}
        self._owned: dict[MessageQueue, _Owned] = {}
        self._loops: set[asyncio.Task[None]] = set()
        self._consuming: set[asyncio.Task[None]] = set()
        self._closing = False
        self._rebalance_now = asyncio.Event()
        self._slots = asyncio.Semaphore(self.options.consume_concurrency)
        self._routes: Routes | None = None
        self._brokers = BrokerChoice(clock)
        self._pool: BrokerPool | None = None
        self._offsets: OffsetStore | None = None

    # -- configuration --------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        self._subs[topic] = Subscription(topic, expression, expression_type,
                                         self._clock.now_ms())

    def register_listener(self, listener: Listener) -> None:
        self._listener = listener

    @property
    def assigned(self) -> set[MessageQueue]:
        """The queues this member consumes now (retry queues included)."""
        return set(self._owned)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._listener is None or not self._subs:
            raise ClientError("subscribe to a topic and register a listener before start()")
        if self.model is MessageModel.CLUSTERING:
            self._subs.setdefault(tp.retry_topic(self.group),
                                  Subscription(tp.retry_topic(self.group)))
        dispatcher = Dispatcher({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._notified})
        self._routes = Routes(self._namesrv, self._clock)
        self._pool = BrokerPool(dispatcher, self._clock)
        routes = self._routes
        self._offsets = (RemoteOffsets(self.group, self._pool, lambda name: self._brokers
                                       .offset_target(routes.group_addresses(name)))
                         if self.model is MessageModel.CLUSTERING
                         else LocalOffsets(self._offsets_file))
        await self._refresh_routes()
        await self.heartbeat()
        await self.rebalance()
        o = self.options
        self._closing = False
        for loop in (self._every(o.heartbeat_s, self.heartbeat),
                     self._every(o.persist_s, self.persist),
                     self._every(o.route_refresh_s, self._refresh_routes),
                     self._rebalance_loop()):
            self._spawn(self._loops, loop)

    async def shutdown(self) -> None:
        """Stop pulling, let running listeners finish, persist offsets, leave the group."""
        if self._routes is None or self._pool is None:
            return
        self._closing = True
        for task in self._loops:
            task.cancel()
        for o in self._owned.values():
            o.task.cancel()
        if self._consuming:  # listeners already running finish and commit
            await asyncio.wait(self._consuming, timeout=SHUTDOWN_GRACE_S)
        await self.persist()
        for o in self._owned.values():
            o.pq.dropped = True
        for addr in self._routes.masters():
            try:
                await self._pool.invoke(addr, RemotingCommand.request(
                    RequestCode.UNREGISTER_CLIENT,
                    {"clientID": self.client_id, "consumerGroup": self.group}))
            except TransportError as exc:
                log.warning("unregister failed", addr=addr, error=str(exc))
        await self._pool.close()
        await self._routes.close()
        self._routes = self._pool = self._offsets = None
        self._owned.clear()

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    # -- periodic work --------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        routes, pool, _ = self._started()
        body = json.dumps({
            "clientID": self.client_id,
            "consumerDataSet": [{
                "groupName": self.group, "consumeType": "CONSUME_PASSIVELY",
                "messageModel": self.model.value,
                "consumeFromWhere": self.options.consume_from.value, "unitMode": False,
                "subscriptionDataSet": [{
                    "topic": s.topic, "subString": s.expression, "expressionType":
                    s.expression_type, "subVersion": s.version, "tagsSet": sorted(s.tags() or ()),
                    "codeSet": [], "classFilterMode": False} for s in self._subs.values()],
            }],
            "producerDataSet": [],
        }).encode()
        for addr in routes.all_addresses():  # slaves too: a pull may go there (seed 000)
            try:
                await pool.call(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=body),
                                "heartbeat")
            except (ClientError, TransportError) as exc:
                log.warning("heartbeat failed", addr=addr, error=str(exc))

    async def persist(self) -> None:
        _, _, offsets = self._started()
        await offsets.persist(list(self._owned))

    async def rebalance(self) -> None:
        """Take the queues this member should own now, release the others."""
        routes, _, _ = self._started()
        for topic in list(self._subs):
            try:
                route = await routes.route(topic)
            except RouteNotFound:
                continue  # a retry topic before the broker registered it
            except (ClientError, TransportError) as exc:
                log.warning("rebalance: no route", topic=topic, error=str(exc))
                continue
            queues = route.subscribe_queues()
            mine = set(queues)
            if self.model is MessageModel.CLUSTERING and queues:
                try:
                    ids = await self._member_ids(self._brokers.offset_target(
                        routes.group_addresses(queues[0].broker_name)))
                    mine = set(allocate(self.options.strategy, self.group, self.client_id,
                                        queues, ids))
                except (AllocationError, ClientError, TransportError) as exc:
                    log.warning("rebalance skipped", topic=topic, error=str(exc))
                    continue
            for q in [q for q in self._owned if q.topic == topic and q not in mine]:
                await self._release(q)
            for q in sorted(mine - set(self._owned)):
                await self._take(q)

    async def _member_ids(self, addr: str | None) -> list[str]:
        _, pool, _ = self._started()
        if addr is None:
            raise ClientError("no broker to ask for the group's members")
        answer = await pool.call(addr, RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group}),
            "consumer list")
        return [str(i) for i in json.loads(answer.body)["consumerIdList"]]

    async def _take(self, queue: MessageQueue) -> None:
        routes, pool, offsets = self._started()
        try:
            start = await offsets.read(queue)
            if start < 0:
                addr = self._brokers.offset_target(routes.group_addresses(queue.broker_name))
                if (self.options.consume_from is ConsumeFrom.FIRST_OFFSET
                        or queue.topic.startswith(tp.RETRY_PREFIX) or addr is None):
                    start = 0
                else:
                    start = await max_offset(pool, addr, queue)
        except (ClientError, TransportError) as exc:
            log.warning("queue not taken: no start offset", queue=queue, error=str(exc))
            return
        pq = ProcessQueue(start)
        offsets.update(queue, start, increase_only=False)
        task = asyncio.get_running_loop().create_task(self._pull_loop(queue, pq, start))
        self._owned[queue] = _Owned(pq, task)
        log.info("queue taken", group=self.group, queue=queue, offset=start)

    async def _release(self, queue: MessageQueue) -> None:
        _, _, offsets = self._started()
        owned = self._owned.pop(queue)
        owned.pq.dropped = True
        owned.task.cancel()
        await offsets.persist([queue])
        offsets.remove(queue)
        log.info("queue released", group=self.group, queue=queue)

    # -- pulling and consuming ------------------------------------------------------------------

    async def _pull_loop(self, queue: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        routes, pool, offsets = self._started()
        sub = self._subs[queue.topic]
        while not pq.dropped:
            if pq.count > MAX_CACHED_MESSAGES or pq.size > MAX_CACHED_BYTES:
                await asyncio.sleep(FLOW_CONTROL_BACKOFF_S)
                continue
            committed = offsets.get(queue) if self.model is MessageModel.CLUSTERING else None
            target = self._brokers.pull_target(queue, routes.group_addresses(queue.broker_name))
            try:
                if target is None:
                    raise ClientError(f"broker {queue.broker_name!r} has no address")
                broker_id, addr = target
                if broker_id != MASTER_ID:  # a slave takes no commit (seed 000)
                    committed = None
                answer = await pool.invoke(addr, pull_request(
                    self.group, queue, offset, sub, commit_offset=committed or -1),
                    LONG_POLL_TIMEOUT_S)
                result = parse_pull(answer, sub)
            except (ClientError, TransportError) as exc:
                if isinstance(exc, TransportError) and target is not None:
                    self._brokers.failed(target[1])
                log.warning("pull failed", queue=queue, error=str(exc))
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)
                continue
            self._brokers.suggest(queue, result.suggest_which_broker_id)
            if pq.dropped:
                return
            offset = result.next_begin_offset
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset moved", queue=queue, offset=offset)
                offsets.update(queue, offset, increase_only=False)
                continue
            pq.put(result.messages, offset)
            for m in result.messages:
                self._spawn(self._consuming, self._consume(queue, pq, [m]))
            if pq.count == 0:  # nothing matched and nothing in flight: move past it
                offsets.update(queue, pq.commit_offset())

    async def _consume(self, queue: MessageQueue, pq: ProcessQueue, msgs: list[Message]) -> None:
        assert self._listener is not None
        async with self._slots:
            if pq.dropped or self._closing:
                return
            try:
                result = await self._listener(msgs)
            except Exception:
                log.exception("listener failed", group=self.group, queue=queue)
                result = ConsumeResult.RECONSUME_LATER
            done = msgs
            if (result is ConsumeResult.RECONSUME_LATER
                    and self.model is MessageModel.CLUSTERING):
                done = [m for m in msgs if await self._send_back(queue, m)]
                kept = [m for m in msgs if m not in done]
                if kept:
                    asyncio.get_running_loop().call_later(
                        RETRY_LOCALLY_S,
                        lambda: self._spawn(self._consuming, self._consume(queue, pq, kept)))
            committed = pq.remove(done)
            if not pq.dropped and self._offsets is not None:
                self._offsets.update(queue, committed)

    async def _send_back(self, queue: MessageQueue, msg: Message) -> bool:
        routes, pool, _ = self._started()
        addr = routes.master(queue.broker_name)
        if addr is None:
            return False
        try:
            await pool.call(addr, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
                "offset": msg.commit_log_offset, "group": self.group,
                "delayLevel": self.options.retry_delay_level,
                "originMsgId": offset_msg_id(msg.store_host, msg.commit_log_offset),
                "originTopic": msg.topic, "unitMode": False,
                "maxReconsumeTimes": self.options.max_reconsume_times}), "send back")
        except (ClientError, TransportError) as exc:
            log.warning("send back failed; consuming again here", error=str(exc))
            return False
        return True

    # -- plumbing ---------------------------------------------------------------------------

    async def _notified(self, conn: Connection, cmd: RemotingCommand) -> None:
        self._rebalance_now.set()

    async def _rebalance_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.options.rebalance_s):
                    await self._rebalance_now.wait()
            except TimeoutError:
                pass
            self._rebalance_now.clear()
            await self._guarded(self.rebalance)

    async def _refresh_routes(self) -> None:
        routes, _, _ = self._started()
        for topic in self._subs:
            routes.forget(topic)
            try:
                await routes.route(topic)
            except (ClientError, TransportError) as exc:
                log.info("no route yet", topic=topic, error=str(exc))

    async def _every(self, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            await self._guarded(work)

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except (ClientError, TransportError) as exc:
            log.warning("periodic work failed", work=getattr(work, "__name__", "?"),
                        error=str(exc))

    @staticmethod
    def _spawn(tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _started(self) -> tuple[Routes, BrokerPool, OffsetStore]:
        if self._routes is None or self._pool is None or self._offsets is None:
            raise NotStarted(f"push consumer {self.group!r} is not started")
        return self._routes, self._pool, self._offsets
