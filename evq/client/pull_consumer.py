"""The pull consumer: the application asks for messages when it wants them.

Its queues come either from :meth:`PullConsumer.assign` (the application chooses) or from
:meth:`PullConsumer.subscribe`, which makes it a member of its group that the brokers list and
notify, splitting each topic with the other members exactly as push consumers do (the same
:class:`~evq.client.group.GroupMember`).  Each assigned queue has a position, the offset its
next :meth:`~PullConsumer.poll` reads from; positions are committed to the broker like a
clustering group's offsets (:class:`RemoteOffsets`), every 5 s and at shutdown with
``auto_commit``, or when the application calls :meth:`~PullConsumer.commit`.

Which broker of a queue's group is asked is chosen as for push consumers (seed 000, through
:meth:`GroupMember.pull`): the one the last answer suggested, else the master, else a slave, so
polls go on from a slave while the master is down, and positions are committed there too, to
be taken back by the master when it returns.

An administrator's reset-by-time reaches a running pull consumer twice over: a subscribed one
is sent RESET_CONSUMER_CLIENT_OFFSET and seeks at once, and any poll at the old position is
answered PULL_OFFSET_MOVED, which moves the position to the reset offset.  A poll that was
already in flight when its queue was sought does not move the position back afterwards.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from evq import logs
from evq.client.broker_choice import BrokerChoice
from evq.client.direct import BlockingLines
from evq.client.errors import ClientError, NotStarted
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
    RemoteOffsets,
    max_offset,
    min_offset,
    offset_for_time,
    reset_notice,
)
from evq.client.pulling import PullResult, PullStatus, Subscription
from evq.client.routes import REFRESH_S, BrokerPool, Routes, TopicRoute
from evq.client.supervision import SupervisionPolicy, Supervisor, periodic
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.message import Message
from evq.domain.queues import MessageQueue
from evq.domain.rebalance import AllocateStrategy
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.security import ClientSecurity
from evq.net.transport import Connection, Dispatcher, TransportError

log = logs.get_logger(__name__)

AUTO_COMMIT_S: Final = 5.0
HEARTBEAT_S: Final = 30.0
REBALANCE_S: Final = 20.0
PULL_TIMEOUT_MARGIN_S: Final = 3.0


class PullConsumer:
    def __init__(self, group: str, namesrv: str, *, auto_commit: bool = True,
                 auto_commit_s: float = AUTO_COMMIT_S, rebalance_s: float = REBALANCE_S,
                 heartbeat_s: float = HEARTBEAT_S, strategy: AllocateStrategy | str = "AVG",
                 client_id: str | None = None, clock: Clock = SYSTEM_CLOCK,
                 supervision: SupervisionPolicy | None = None,
                 security: ClientSecurity | None = None) -> None:
        """``security`` signs every request (credentials) and may open connections over
        TLS."""
        self.group = group
        self.security = security
        self.client_id = client_id or new_client_id()
        self.auto_commit = auto_commit
        self._namesrv = namesrv
        self._auto_commit_s = auto_commit_s
        self._rebalance_s = rebalance_s
        self._heartbeat_s = heartbeat_s
        self._strategy = strategy
        self._clock = clock
        self._supervision = supervision or SupervisionPolicy()
        self._subs: dict[str, Subscription] = {}
        self._assigned: dict[MessageQueue, int] = {}
        self._seeks: dict[MessageQueue, int] = {}
        """How often each queue was sought: a poll started before a seek keeps its hands off
        the position."""
        self._positions = threading.Lock()
        """Held to change ``_assigned`` or ``_seeks``, for a few steps and never across an
        await: :meth:`poll_now` moves a position on a caller's thread while the loop may be
        rebalancing, and without it a poll could put back a queue the loop had just taken
        away."""
        self._pull_subs: dict[tuple[str, str], Subscription] = {}
        """The subscription a pull of (topic, expression) sends, made once."""
        self._rebalance_now = asyncio.Event()
        self._supervisor: Supervisor | None = None
        """Runs the background loops; :meth:`pull` raises once one of them failed for good."""
        self._routes: Routes | None = None
        self._pool: BrokerPool | None = None
        self._member: GroupMember | None = None
        self._offsets: RemoteOffsets | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` with the rest of the group (before :meth:`start`)."""
        if self._routes is not None:
            raise ClientError("subscribe before start()")
        self._subs[topic] = Subscription(topic, expression, "TAG", self._clock.now_ms())

    async def start(self) -> None:
        dispatcher = Dispatcher({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._notified,
                                 RequestCode.RESET_CONSUMER_CLIENT_OFFSET: self._reset_notified})
        self._routes = routes = Routes(self._namesrv, self._clock, security=self.security)
        self._pool = pool = BrokerPool(dispatcher, self._clock, security=self.security)
        self._member = member = GroupMember(
            self.group, self.client_id, routes, pool, namesrv=self._namesrv,
            subscriptions=self._subs,
            consume_type=ConsumeType.ACTIVELY, model=MessageModel.CLUSTERING,
            consume_from=ConsumeFrom.LAST_OFFSET, strategy=self._strategy,
            brokers=BrokerChoice(self._clock))
        self._offsets = RemoteOffsets(self.group, pool, member.offset_address,
                                      member.broker_failed)
        self._supervisor = supervisor = Supervisor(f"pull consumer {self.group}",
                                                   self._supervision)
        if self.auto_commit:
            supervisor.loop("auto commit", periodic(self._auto_commit_s, self.commit))
        if self._subs:
            for topic in self._subs:
                try:
                    await routes.route(topic)
                except (ClientError, TransportError) as exc:
                    log.info("no route yet", topic=topic, error=str(exc))
            await member.heartbeat()
            settled = await settle(self.rebalance)
            supervisor.loop("heartbeat", periodic(self._heartbeat_s, member.heartbeat))
            supervisor.loop("refresh routes", periodic(REFRESH_S, routes.refresh))
            supervisor.loop("rebalance", rebalance_rounds(
                self.rebalance, self._rebalance_now, self._rebalance_s, settled=settled))

    async def shutdown(self) -> None:
        """Stop rebalancing, commit the positions (with ``auto_commit``) and leave."""
        if self._routes is None or self._pool is None or self._member is None:
            return
        if self._supervisor is not None:
            await self._supervisor.close()
        if self.auto_commit:
            await self.commit()
        if self._subs:
            await self._member.unregister()
        await self._member.close()
        await self._pool.close()
        await self._routes.close()
        self._routes = self._pool = self._member = self._offsets = None

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    # -- queues ---------------------------------------------------------------------------------

    async def queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of ``topic``."""
        return (await self._route_of(topic)).subscribe_queues()

    async def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume these queues from the group's committed offsets (0 when none)."""
        if self._subs:
            raise ClientError("a subscribed pull consumer gets its queues from rebalance")
        assigned = {q: await self._start_offset(q) for q in queues}
        with self._positions:
            self._assigned = assigned

    async def rebalance(self) -> bool:
        """Take the queues of the subscribed topics this member should own now; False when
        some topic could not be balanced yet."""
        member = self._started()[2]
        settled = True
        for topic in list(self._subs):
            mine = await member.assignment(topic)
            if mine is None:
                settled = False
                continue
            gone = {q: o for q, o in self._assigned.items() if q.topic == topic and q not in mine}
            if gone and self.auto_commit:
                await self.commit(gone)
            with self._positions:
                for q in gone:
                    del self._assigned[q]
            for q in sorted(mine - set(self._assigned)):
                try:
                    offset = await self._start_offset(q)
                    with self._positions:
                        self._assigned[q] = offset
                except (ClientError, TransportError) as exc:
                    log.warning("queue not taken: no start offset", queue=q, error=str(exc))
                    settled = False
            if gone or mine - set(self._assigned):
                log.info("pull consumer rebalanced", group=self.group, topic=topic,
                         queues=sorted(q.queue_id for q in self._assigned if q.topic == topic))
        return settled

    async def _start_offset(self, queue: MessageQueue) -> int:
        offsets = self._started()[3]
        await self._route_of(queue.topic)
        return max(await offsets.read(queue), 0)

    @property
    def assignment(self) -> dict[MessageQueue, int]:
        """Assigned queues and the offset the next :meth:`poll` of each reads from."""
        return dict(self._assigned)

    # -- positions ------------------------------------------------------------------------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        with self._positions:
            if queue not in self._assigned:
                raise ClientError(f"{queue} is not assigned")
            self._assigned[queue] = offset
            self._seeks[queue] = self._seeks.get(queue, 0) + 1

    async def seek_to_begin(self, queue: MessageQueue) -> None:
        self.seek(queue, await self._ask(queue, lambda pool, addr: min_offset(pool, addr, queue)))

    async def seek_to_end(self, queue: MessageQueue) -> None:
        self.seek(queue, await self._ask(queue, lambda pool, addr: max_offset(pool, addr, queue)))

    async def seek_to_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> None:
        """To the first message of ``queue`` stored at or after ``timestamp_ms``."""
        self.seek(queue, await self._ask(
            queue, lambda pool, addr: offset_for_time(pool, addr, queue, timestamp_ms)))

    # -- reading --------------------------------------------------------------------------------

    async def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, *,
                   expression: str = "*", wait_ms: int = 0) -> PullResult:
        """Messages of ``queue`` from ``offset``; ``wait_ms`` > 0 long-polls that long.
        Raises :class:`~evq.client.errors.BackgroundFailed` once a background loop
        (rebalance, heartbeat, auto-commit) has failed for good: the consumer's queues and
        positions can no longer be trusted, and it should be shut down."""
        routes, _, member, _ = self._started()
        assert self._supervisor is not None
        self._supervisor.check()
        if routes.cached(queue.topic) is None:
            await routes.route(queue.topic)
        return await member.pull(queue, offset, self._pull_sub(queue.topic, expression),
                                 max_nums=max_nums, suspend_ms=wait_ms,
                                 timeout=wait_ms / 1000 + PULL_TIMEOUT_MARGIN_S)

    async def poll(self, queue: MessageQueue, max_nums: int = 32, *, wait_ms: int = 0
                   ) -> PullResult:
        """Pull an assigned queue from its position and move the position past the result
        (or, after PULL_OFFSET_MOVED, to where the broker says)."""
        offset = self._assigned.get(queue)
        if offset is None:
            raise ClientError(f"{queue} is not assigned")
        seeks = self._seeks.get(queue, 0)
        result = await self.pull(queue, offset, max_nums, expression=self._expression(queue),
                                 wait_ms=wait_ms)
        self._moved(queue, seeks, result)
        return result

    def poll_now(self, queue: MessageQueue, max_nums: int, lines: BlockingLines, *,
                 wait_ms: int = 0) -> PullResult | None:
        """:meth:`poll` made on the calling thread over one of ``lines``, for a caller that
        may block (:class:`~evq.client.blocking.SyncPullConsumer`): the result, or None where
        the loop's :meth:`poll` is to make it: the consumer is not started, the queue is not
        assigned or its topic not routed yet (the loop's poll says so or routes it), no line
        is to spare, or the broker failed at the transport (the loop's poll goes on with the
        rest of its group).

        Reads the loop's state (the routes, a position: each read in one step), and writes a
        position under ``_positions`` as :meth:`poll` does."""
        routes, member, supervisor = self._routes, self._member, self._supervisor
        if routes is None or member is None or supervisor is None:
            return None
        supervisor.check()
        offset = self._assigned.get(queue)
        if offset is None or routes.cached(queue.topic) is None:
            return None
        seeks = self._seeks.get(queue, 0)
        result = member.pull_now(queue, offset,
                                 self._pull_sub(queue.topic, self._expression(queue)), lines,
                                 max_nums=max_nums, suspend_ms=wait_ms,
                                 timeout=wait_ms / 1000 + PULL_TIMEOUT_MARGIN_S)
        if result is not None:
            self._moved(queue, seeks, result)
        return result

    def _moved(self, queue: MessageQueue, seeks: int, result: PullResult) -> None:
        """The position of ``queue`` past ``result``, unless the queue was sought (or taken
        away) since the poll read it (``seeks``)."""
        with self._positions:
            if self._seeks.get(queue, 0) != seeks or queue not in self._assigned:
                return
            self._assigned[queue] = result.next_begin_offset
        if result.status is PullStatus.OFFSET_ILLEGAL:
            log.info("offset moved", group=self.group, queue=queue,
                     offset=result.next_begin_offset)

    def _expression(self, queue: MessageQueue) -> str:
        """What a poll of ``queue`` filters by: its topic's subscription, else everything."""
        sub = self._subs.get(queue.topic)
        return sub.expression if sub else "*"

    def _pull_sub(self, topic: str, expression: str) -> Subscription:
        """The subscription a pull of ``topic`` by ``expression`` sends, made once (by
        whichever thread asks first)."""
        sub = self._pull_subs.get((topic, expression))
        if sub is None:
            sub = self._pull_subs.setdefault((topic, expression),
                                             Subscription(topic, expression))
        return sub

    async def poll_all(self, max_nums: int = 32, *, wait_ms: int = 0) -> list[Message]:
        """One :meth:`poll` of every assigned queue; with ``wait_ms`` the polls long-poll
        together and the first messages to arrive are returned (the other polls are called
        off, their positions untouched)."""
        queues = sorted(self._assigned)
        if wait_ms <= 0:
            results = await asyncio.gather(*(self.poll(q, max_nums) for q in queues))
            return [m for r in results for m in r.messages]
        tasks = [asyncio.create_task(self.poll(q, max_nums, wait_ms=wait_ms)) for q in queues]
        msgs: list[Message] = []
        try:
            pending: set[asyncio.Task[PullResult]] = set(tasks)
            while pending and not msgs:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                msgs += [m for t in done for m in t.result().messages]
        finally:
            for t in tasks:
                t.cancel()
        return msgs

    # -- offsets --------------------------------------------------------------------------------

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Store ``offsets`` (default: every assigned queue's position) on the brokers."""
        store = self._started()[3]
        chosen = dict(self._assigned if offsets is None else offsets)
        for q, offset in chosen.items():
            store.update(q, offset, increase_only=False)
        await store.persist(chosen)

    async def committed(self, queue: MessageQueue) -> int:
        """The group's stored offset of ``queue``, -1 when none."""
        store = self._started()[3]
        await self._route_of(queue.topic)
        return await store.read(queue)

    # -- plumbing -------------------------------------------------------------------------------

    async def _notified(self, conn: Connection, cmd: RemotingCommand) -> None:
        self._rebalance_now.set()

    async def _reset_notified(self, conn: Connection, cmd: RemotingCommand) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: an administrator moved this group's offsets."""
        for queue, offset in reset_notice(cmd, self.group).items():
            if queue in self._assigned:
                self.seek(queue, offset)
                log.info("offset reset", group=self.group, queue=queue, offset=offset)

    async def _route_of(self, topic: str) -> TopicRoute:
        routes = self._started()[0]
        return await routes.route(topic)

    async def _ask(self, queue: MessageQueue,
                   question: Callable[[BrokerPool, str], Awaitable[int]]) -> int:
        """Ask ``queue``'s master about its offsets, or a slave while it is down.  A broker
        that fails at the transport is marked down and the question goes at once to the next
        one of the group, as pulls do: the first seek after a master dies is answered by its
        slave instead of failing."""
        await self._route_of(queue.topic)
        _, pool, member, _ = self._started()
        asked: set[str] = set()
        while (addr := member.offset_address(queue.broker_name)) not in asked:
            if addr is None:
                raise ClientError(f"broker {queue.broker_name!r} has no address")
            try:
                return await question(pool, addr)
            except TransportError:
                member.broker_failed(addr)
                asked.add(addr)
        raise ClientError(f"no broker of {queue.broker_name!r} answered")

    def _started(self) -> tuple[Routes, BrokerPool, GroupMember, RemoteOffsets]:
        if (self._routes is None or self._pool is None or self._member is None
                or self._offsets is None):
            raise NotStarted(f"pull consumer {self.group!r} is not started")
        return self._routes, self._pool, self._member, self._offsets
