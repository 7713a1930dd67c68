"""The push consumer: rebalanced queues, long-polling pulls, a listener called per message.

One task per owned queue pulls (long polling, 15 s hold) into that queue's
:class:`ProcessQueue`, unless the queue already holds more than the flow-control limits allow
(:mod:`evq.client.flow_control`).  A concurrent listener gets each message in its own task, at
most ``consume_concurrency`` at once, and ``consume_timeout_s`` to answer; the queue's offset
advances to the smallest message still in flight and is persisted every 5 s and at shutdown.
A listener answering RECONSUME_LATER (or raising, or timing out) has the message sent back to
the broker (CONSUMER_SEND_MSG_BACK), which redelivers it through ``%RETRY%<group>`` with
``reconsume_times`` + 1; when its broker cannot take it back, the consumer sends a copy to the
retry topic itself, and only when that fails too keeps the message and consumes it again after
5 s.  Broadcasting consumers do not retry (RocketMQ drops the failure) and keep their offsets
in a local file.  An :class:`~evq.client.orderly.Orderly` listener is run by
:mod:`evq.client.orderly` instead: queue locks, one message at a time per queue.

Members agree on who owns which queue through :class:`~evq.client.group.GroupMember`: every
20 s, whenever the broker sends NOTIFY_CONSUMER_IDS_CHANGED, and soon again after a round that
could not settle.  An offset reset by an administrator reaches the consumer as PULL_OFFSET_MOVED
on its next pull, or at once as RESET_CONSUMER_CLIENT_OFFSET: the queue's cached messages are
dropped and pulling starts over from the new offset.

Every loop (heartbeat, rebalance, route refresh, offset persistence, lock renewal, each
queue's pulls) and every listener call runs under one :class:`~evq.client.supervision.Supervisor`:
an unexpected failure is logged and the loop restarted, and a loop that keeps failing makes
:meth:`PushConsumer.wait` raise instead of leaving a consumer that quietly consumes nothing.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import attrs

from evq import logs
from evq.client.broker_choice import BrokerChoice
from evq.client.errors import BackgroundFailed, ClientError, NotStarted
from evq.client.flow_control import HOLD_S, FlowLimits, Holds
from evq.client.group import (
    ConsumeFrom,
    ConsumeType,
    GroupMember,
    MessageModel,
    rebalance_rounds,
    settle,
)
from evq.client.identity import new_client_id
from evq.client.offsets import (
    LocalOffsets,
    OffsetStore,
    RemoteOffsets,
    max_offset,
    reset_notice,
)
from evq.client.orderly import LOCK_RENEW_S, SUSPEND_S, Orderly, OrderlyConsumption
from evq.client.process_queue import ProcessQueue
from evq.client.pulling import LONG_POLL_TIMEOUT_S, SUSPEND_MS, PullStatus, Subscription
from evq.client.routes import REFRESH_S, BrokerPool, Routes
from evq.client.supervision import Step, SupervisionPolicy, Supervisor, periodic
from evq.domain import topics as tp
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.message import Message
from evq.domain.queues import MessageQueue
from evq.domain.rebalance import AllocateStrategy
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.security import ClientSecurity
from evq.net.transport import Connection, Dispatcher, TransportError

__all__ = ["BackgroundFailed", "ConsumeFrom", "ConsumeResult", "ConsumerOptions", "MessageModel",
           "PushConsumer"]

log = logs.get_logger(__name__)

HEARTBEAT_S: Final = 30.0
REBALANCE_S: Final = 20.0
PERSIST_S: Final = 5.0
RETRY_LOCALLY_S: Final = 5.0
SHUTDOWN_GRACE_S: Final = 10.0
PULL_ERROR_BACKOFF_S: Final = 3.0
CONSUME_TIMEOUT_S: Final = 15 * 60.0


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
    pull_batch_size: int = 32
    flow_limits: FlowLimits = attrs.Factory(FlowLimits)
    consume_timeout_s: float = CONSUME_TIMEOUT_S
    """How long a concurrent listener call may run before it is cancelled and its messages
    sent back (Java's ``consumeTimeout``, 15 minutes)."""
    suspend_s: float = SUSPEND_S
    """Pause before an orderly queue offers a suspended message again."""
    lock_renew_s: float = LOCK_RENEW_S
    supervision: SupervisionPolicy = attrs.Factory(SupervisionPolicy)
    """How often a background loop that fails unexpectedly is retried before the consumer
    fails (:meth:`PushConsumer.wait` raises)."""


def default_offsets_file(client_id: str, group: str) -> Path:
    """Where a broadcasting consumer keeps its offsets: one file per client, as RocketMQ's
    ``<clientId>/<group>/offsets.json``, so that two consumers of one group on one host never
    overwrite each other.  A consumer that should resume after a restart passes a stable
    ``client_id`` (``new_client_id("name")``) or its own ``offsets_file``."""
    return Path.home() / ".evq" / "offsets" / client_id / group / "offsets.json"


@attrs.define(slots=True)
class _Owned:
    pq: ProcessQueue
    task: asyncio.Task[None]
    """The queue's pull loop."""


class PushConsumer:
    def __init__(self, group: str, namesrv: str, *,
                 model: MessageModel = MessageModel.CLUSTERING,
                 listener: Listener | Orderly | None = None,
                 options: ConsumerOptions | None = None,
                 client_id: str | None = None,
                 offsets_file: Path | None = None,
                 clock: Clock = SYSTEM_CLOCK,
                 security: ClientSecurity | None = None) -> None:
        """``security`` signs every request (credentials) and may open connections over
        TLS; the consumer's own retry producer uses it too."""
        self.group = group
        self.security = security
        self.model = model
        self.options = options or ConsumerOptions()
        self.client_id = client_id or new_client_id()
        self._namesrv = namesrv
        self._listener = listener
        self._offsets_file = offsets_file or default_offsets_file(self.client_id, group)
        self._clock = clock
        self._subs: dict[str, Subscription] = {}
        self._owned: dict[MessageQueue, _Owned] = {}
        self._supervisor: Supervisor | None = None
        """Runs the background loops; kept after shutdown so that :meth:`wait` still says how
        the last run ended."""
        self._consuming: set[asyncio.Task[None]] = set()
        self._closing = False
        self._rebalance_now = asyncio.Event()
        self._slots = asyncio.Semaphore(self.options.consume_concurrency)
        self._holds = Holds()
        self._routes: Routes | None = None
        self._pool: BrokerPool | None = None
        self._member: GroupMember | None = None
        self._offsets: OffsetStore | None = None
        self._orderly: OrderlyConsumption | None = None

    # -- configuration --------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        self._subs[topic] = Subscription(topic, expression, expression_type,
                                         self._clock.now_ms())

    def register_listener(self, listener: Listener | Orderly) -> None:
        """A concurrent listener, or one wrapped in :class:`~evq.client.orderly.Orderly`."""
        self._listener = listener

    @property
    def assigned(self) -> set[MessageQueue]:
        """The queues this member consumes now (retry queues included)."""
        return set(self._owned)

    def process_queue(self, queue: MessageQueue) -> ProcessQueue | None:
        """What ``queue`` holds between pull and acknowledgement (None when not owned)."""
        owned = self._owned.get(queue)
        return owned.pq if owned else None

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group and take this member's queues; returns once they are taken, or after
        a few quick retries when the group cannot be balanced yet (the background keeps
        retrying)."""
        if self._listener is None or not self._subs:
            raise ClientError("subscribe to a topic and register a listener before start()")
        if self.model is MessageModel.CLUSTERING:
            self._subs.setdefault(tp.retry_topic(self.group),
                                  Subscription(tp.retry_topic(self.group)))
        dispatcher = Dispatcher({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._notified,
                                 RequestCode.RESET_CONSUMER_CLIENT_OFFSET: self._reset_notified})
        o = self.options
        self._routes = routes = Routes(self._namesrv, self._clock, security=self.security)
        self._pool = pool = BrokerPool(dispatcher, self._clock, security=self.security)
        self._member = member = GroupMember(
            self.group, self.client_id, routes, pool, namesrv=self._namesrv,
            subscriptions=self._subs, consume_type=ConsumeType.PASSIVELY, model=self.model,
            consume_from=o.consume_from, strategy=o.strategy, brokers=BrokerChoice(self._clock))
        self._offsets = (RemoteOffsets(self.group, pool, member.offset_address,
                                       member.broker_failed)
                         if self.model is MessageModel.CLUSTERING
                         else LocalOffsets(self._offsets_file))
        self._supervisor = supervisor = Supervisor(f"push consumer {self.group}",
                                                   o.supervision)
        if isinstance(self._listener, Orderly):
            self._orderly = OrderlyConsumption(
                member, self._listener, self._offsets, self._clock, supervisor,
                suspend_s=o.suspend_s, max_reconsume_times=o.max_reconsume_times)
        self._closing = False
        await self._refresh_routes()
        await member.heartbeat()
        settled = await settle(self.rebalance)
        supervisor.loop("heartbeat", periodic(o.heartbeat_s, self.heartbeat))
        supervisor.loop("persist offsets", periodic(o.persist_s, self.persist))
        supervisor.loop("refresh routes", periodic(o.route_refresh_s, self._refresh_routes))
        supervisor.loop("rebalance", rebalance_rounds(self.rebalance, self._rebalance_now,
                                                      o.rebalance_s, settled=settled))
        if self._orderly is not None and self._orderly.locking:
            supervisor.loop("renew locks", periodic(o.lock_renew_s, self._renew_locks))

    async def wait(self) -> None:
        """Until :meth:`shutdown`.  Raises :class:`BackgroundFailed` as soon as a background
        loop (heartbeat, rebalance, a queue's pulls ...) has failed so often that it was given
        up: the consumer then consumes nothing more, and should be shut down."""
        if self._supervisor is None:
            raise NotStarted(f"push consumer {self.group!r} is not started")
        await self._supervisor.wait()

    async def shutdown(self) -> None:
        """Stop pulling, let running listeners finish, persist offsets, unlock, leave."""
        if self._routes is None or self._pool is None or self._member is None:
            return
        self._closing = True
        if self._supervisor is not None:
            await self._supervisor.close()  # every loop, the queues' pull loops included
        if self._consuming:  # listeners already running finish and commit
            await asyncio.wait(self._consuming, timeout=SHUTDOWN_GRACE_S)
        if self._orderly is not None:
            await self._orderly.close()
        await self.persist()
        for o in self._owned.values():
            o.pq.dropped = True
        if self._orderly is not None:
            await self._orderly.unlock(list(self._owned))
        await self._member.unregister()
        await self._member.close()
        await self._pool.close()
        await self._routes.close()
        self._routes = self._pool = self._member = self._offsets = self._orderly = None
        self._owned.clear()

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    # -- periodic work --------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        await self._started()[2].heartbeat()

    async def persist(self) -> None:
        await self._started()[3].persist(list(self._owned))

    async def rebalance(self) -> bool:
        """Take the queues this member should own now, release the others.  False when some
        topic could not be balanced (no route, not listed yet, a queue still locked by its
        previous owner): the caller tries again soon."""
        member = self._started()[2]
        settled = True
        for topic in list(self._subs):
            mine = await member.assignment(topic)
            if mine is None:
                settled = False
                continue
            for q in [q for q in self._owned if q.topic == topic and q not in mine]:
                await self._release(q)
            for q in sorted(mine - set(self._owned)):
                settled = await self._take(q) and settled
        return settled

    async def _renew_locks(self) -> None:
        if self._orderly is not None:
            await self._orderly.lock({q: o.pq for q, o in self._owned.items()})

    async def _take(self, queue: MessageQueue) -> bool:
        _, pool, member, offsets = self._started()
        pq = ProcessQueue(0)
        # An orderly queue is locked before its offset is read: the previous owner commits
        # before it unlocks, so the offset read now is where it stopped.
        if self._orderly is not None and queue not in await self._orderly.lock({queue: pq}):
            log.info("queue not taken: locked by another member", queue=queue)
            return False
        try:
            start = await offsets.read(queue)
            if start < 0:
                addr = member.offset_address(queue.broker_name)
                if (self.options.consume_from is ConsumeFrom.FIRST_OFFSET
                        or queue.topic.startswith(tp.RETRY_PREFIX) or addr is None):
                    start = 0
                else:
                    start = await max_offset(pool, addr, queue)
        except (ClientError, TransportError) as exc:
            log.warning("queue not taken: no start offset", queue=queue, error=str(exc))
            if self._orderly is not None:
                await self._orderly.unlock([queue])
            return False
        offsets.update(queue, start, increase_only=False)
        self._pull(queue, pq.restarted(start))
        log.info("queue taken", group=self.group, queue=queue, offset=start)
        return True

    def _pull(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        task = self._supervised().loop(f"pull {queue}", self._pull_rounds(queue, pq))
        self._owned[queue] = _Owned(pq, task)

    async def _release(self, queue: MessageQueue) -> None:
        offsets = self._started()[3]
        owned = self._owned.pop(queue)
        owned.task.cancel()
        if self._orderly is not None:  # the message in hand is finished and committed
            await self._orderly.stop(queue)
        owned.pq.dropped = True
        await offsets.persist([queue])
        offsets.remove(queue)
        if self._orderly is not None:
            await self._orderly.unlock([queue])
        log.info("queue released", group=self.group, queue=queue)

    async def _reset(self, queue: MessageQueue, offset: int) -> None:
        """Drop what ``queue`` holds and pull again from ``offset``, which is persisted first
        so that no later commit of the old position overwrites it."""
        offsets = self._started()[3]
        owned = self._owned.get(queue)
        if owned is None:
            return
        owned.pq.dropped = True
        if owned.task is not asyncio.current_task():
            owned.task.cancel()
        if self._orderly is not None:
            await self._orderly.stop(queue)
        offsets.update(queue, offset, increase_only=False)
        await offsets.persist([queue])
        if self._owned.get(queue) is owned:
            self._pull(queue, owned.pq.restarted(offset))
            log.info("queue offset reset", group=self.group, queue=queue, offset=offset)

    # -- pulling and consuming ------------------------------------------------------------------

    def _pull_rounds(self, queue: MessageQueue, pq: ProcessQueue) -> Step:
        """The step of ``queue``'s pull loop: one pull (or a pause while the queue is held
        back), until the queue is dropped."""
        sub = self._subs[queue.topic]
        offset = pq.commit_offset()

        async def step() -> bool:
            nonlocal offset
            member, offsets = self._started()[2:]
            if pq.dropped:
                return False
            if await self._held_back(queue, pq):
                return True
            committed = offsets.get(queue) if self.model is MessageModel.CLUSTERING else None
            try:
                result = await member.pull(
                    queue, offset, sub, max_nums=self.options.pull_batch_size,
                    suspend_ms=SUSPEND_MS, timeout=LONG_POLL_TIMEOUT_S,
                    commit_offset=committed or -1)
            except (ClientError, TransportError) as exc:
                log.warning("pull failed", queue=queue, error=str(exc))
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)
                return True
            if pq.dropped:
                return False
            offset = result.next_begin_offset
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset moved", queue=queue, offset=offset)
                await self._reset(queue, offset)
                return False
            pq.put(result.messages, offset)
            if self._orderly is not None:
                self._orderly.wake(queue, pq)
            else:
                for m in result.messages:
                    self._spawn_consume(queue, pq, [m])
            if pq.count == 0:  # nothing matched and nothing in flight: move past it
                offsets.update(queue, pq.commit_offset())
            return True

        return step

    async def _held_back(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        """Wait a little instead of pulling when ``pq`` is over a flow-control limit, or is an
        orderly queue this member does not hold the lock of."""
        if self._orderly is not None and not self._orderly.may_consume(pq):
            await asyncio.sleep(PULL_ERROR_BACKOFF_S)
            return True
        exceeded = self.options.flow_limits.exceeded(pq, orderly=self._orderly is not None)
        if exceeded is None:
            return False
        if self._holds.hit():
            log.warning("flow control: pull held back", group=self.group, queue=queue,
                        limit=exceeded.value, count=pq.count, size=pq.size, span=pq.span,
                        holds=self._holds.count)
        await asyncio.sleep(HOLD_S)
        return True

    async def _consume(self, queue: MessageQueue, pq: ProcessQueue, msgs: list[Message]) -> None:
        assert self._listener is not None and not isinstance(self._listener, Orderly)
        async with self._slots:
            if pq.dropped or self._closing:
                return
            try:
                async with asyncio.timeout(self.options.consume_timeout_s):
                    result = await self._listener(msgs)
            except TimeoutError:
                log.warning("listener timed out; messages sent back", group=self.group,
                            queue=queue, timeout_s=self.options.consume_timeout_s)
                result = ConsumeResult.RECONSUME_LATER
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
                        RETRY_LOCALLY_S, lambda: self._spawn_consume(queue, pq, kept))
            committed = pq.remove(done)
            if not pq.dropped and self._offsets is not None:
                self._offsets.update(queue, committed)

    async def _send_back(self, queue: MessageQueue, msg: Message) -> bool:
        return await self._started()[2].send_back(
            queue, msg, delay_level=self.options.retry_delay_level,
            max_reconsume_times=self.options.max_reconsume_times)

    # -- plumbing ---------------------------------------------------------------------------

    async def _notified(self, conn: Connection, cmd: RemotingCommand) -> None:
        self._rebalance_now.set()

    async def _reset_notified(self, conn: Connection, cmd: RemotingCommand) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: an administrator moved this group's offsets."""
        for queue, offset in reset_notice(cmd, self.group).items():
            if queue in self._owned:
                await self._reset(queue, offset)

    async def _refresh_routes(self) -> None:
        routes = self._started()[0]
        for topic in self._subs:
            routes.forget(topic)
            try:
                await routes.route(topic)
            except (ClientError, TransportError) as exc:
                log.info("no route yet", topic=topic, error=str(exc))

    def _spawn_consume(self, queue: MessageQueue, pq: ProcessQueue, msgs: list[Message]
                       ) -> None:
        task = self._supervised().task(f"consume {queue}", self._consume(queue, pq, msgs))
        self._consuming.add(task)
        task.add_done_callback(self._consuming.discard)

    def _supervised(self) -> Supervisor:
        if self._supervisor is None:
            raise NotStarted(f"push consumer {self.group!r} is not started")
        return self._supervisor

    def _started(self) -> tuple[Routes, BrokerPool, GroupMember, OffsetStore]:
        if (self._routes is None or self._pool is None or self._member is None
                or self._offsets is None):
            raise NotStarted(f"push consumer {self.group!r} is not started")
        return self._routes, self._pool, self._member, self._offsets
