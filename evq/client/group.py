"""One member of a consumer group, as the brokers see it: what push and pull consumers share.

A member tells every master it knows about itself (HEART_BEAT), asks a master for the group's
client ids and runs :func:`evq.domain.rebalance.allocate` over them to find its queues, gives
messages back (CONSUMER_SEND_MSG_BACK, or, when the broker cannot take it back, sends a copy to
``%RETRY%<group>`` itself, as Java's client does), holds orderly locks (LOCK_BATCH_MQ /
UNLOCK_BATCH_MQ) and leaves (UNREGISTER_CLIENT).  It also pulls and says where offsets go,
picking the master or a slave of each broker group as seed 000 says
(:class:`~evq.client.broker_choice.BrokerChoice`).  Push and pull consumers differ only in what
they do with the queues; the conversation is this one class, so both split a topic exactly
alike and both go on reading from a slave while its master is down.

A rebalance round can fail to *settle*: the topic has no route yet (a topic auto-created a
moment ago is known to its broker before the name server hears of it), or the broker does not
list this member yet (its heartbeat went nowhere because no route named that broker when it was
sent).  :meth:`GroupMember.assignment` heartbeats a master that does not list this member and
asks again, and :func:`rebalance_rounds` retries a round that still did not settle with a
short, doubling backoff instead of waiting a whole period.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from evq import logs
from evq.client.broker_choice import BrokerChoice
from evq.client.direct import BlockingLines
from evq.client.errors import BrokerRefused, ClientError, RouteNotFound
from evq.client.producer import Producer
from evq.client.pulling import PullResult, Subscription, parse_pull, pull_request
from evq.client.routes import BrokerPool, Routes
from evq.client.supervision import Step
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.codes import ResponseCode
from evq.domain.message import Message, Prop
from evq.domain.queues import MessageQueue
from evq.domain.rebalance import AllocateStrategy, AllocationError, allocate
from evq.domain.record import offset_msg_id
from evq.domain.retry import FIRST_RETRY_LEVEL
from evq.net.codes import RequestCode
from evq.net.fastjson import queue_json
from evq.net.headers.clients import (
    ConsumerSendMsgBackRequest,
    GetConsumerListByGroupRequest,
    UnregisterClientRequest,
)
from evq.net.protocol import RemotingCommand
from evq.net.routes import MASTER_ID
from evq.net.transport import TransportError

log = logs.get_logger(__name__)

UNSETTLED_FIRST_RETRY_S: Final = 0.1
"""First retry after a round that did not settle; doubled each time, capped at the period."""
START_SETTLE_TRIES: Final = 4
"""Rounds ``start()`` tries (0.1 s, 0.2 s, 0.4 s apart) before leaving the rest to the
background: a topic created by the send just before is usually routed by then."""
TO_DLQ: Final = -1
"""A send-back delay level that puts the message straight into ``%DLQ%<group>``."""
INNER_PRODUCER_GROUP: Final = "CLIENT_INNER_PRODUCER"
"""The producer group of a consumer's own sends to its retry topic (Java's name)."""


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(enum.Enum):
    """Where a queue with no stored offset starts."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"


class ConsumeType(enum.Enum):
    """How the broker lists the member: a push consumer is fed, a pull consumer asks."""

    PASSIVELY = "CONSUME_PASSIVELY"
    ACTIVELY = "CONSUME_ACTIVELY"


def retry_message(group: str, msg: Message, *, delay_level: int,
                  max_reconsume_times: int) -> Message:
    """A copy of ``msg`` for ``%RETRY%<group>``, as the broker would have made it from a
    send-back: the original topic and message id in properties, one more reconsume, the
    consumer's limit for the broker to move it to the DLQ once it is reached."""
    props = dict(msg.properties)
    props.setdefault(Prop.ORIGIN_MESSAGE_ID, offset_msg_id(msg.store_host, msg.commit_log_offset))
    props[Prop.RETRY_TOPIC] = msg.topic
    props[Prop.RECONSUME_TIME] = str(msg.reconsume_times + 1)
    props[Prop.MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    props[Prop.DELAY] = str(delay_level if delay_level > 0
                            else FIRST_RETRY_LEVEL + msg.reconsume_times)
    props.pop(Prop.TRAN_MSG, None)
    return Message(topic=tp.retry_topic(group), body=msg.body, flag=msg.flag, properties=props,
                   sysflag=msg.sysflag & sf.COMPRESSED, reconsume_times=msg.reconsume_times + 1)


class GroupMember:
    def __init__(self, group: str, client_id: str, routes: Routes, pool: BrokerPool, *,
                 namesrv: str, subscriptions: dict[str, Subscription], consume_type: ConsumeType,
                 model: MessageModel, consume_from: ConsumeFrom,
                 strategy: AllocateStrategy | str, brokers: BrokerChoice | None = None) -> None:
        self.group = group
        self.client_id = client_id
        self.model = model
        self._routes = routes
        self._pool = pool
        self._subs = subscriptions
        self._consume_type = consume_type
        self._consume_from = consume_from
        self._strategy = strategy
        self._brokers = brokers or BrokerChoice()
        self._told: set[str] = set()
        """Masters that accepted a heartbeat since they last denied knowing this member."""
        self._namesrv = namesrv
        self._security = pool.security
        """The retry producer signs as the consumer's own connections do."""
        self._producer: Producer | None = None
        """Started on the first send-back a broker could not take (see :meth:`send_back`)."""
        self._producer_started = asyncio.Lock()

    # -- membership -------------------------------------------------------------------------

    def _heartbeat_body(self) -> bytes:
        return json.dumps({
            "clientID": self.client_id,
            "consumerDataSet": [{
                "groupName": self.group, "consumeType": self._consume_type.value,
                "messageModel": self.model.value,
                "consumeFromWhere": self._consume_from.value, "unitMode": False,
                "subscriptionDataSet": [{
                    "topic": s.topic, "subString": s.expression, "expressionType":
                    s.expression_type, "subVersion": s.version, "tagsSet": sorted(s.tags() or ()),
                    "codeSet": [], "classFilterMode": False} for s in self._subs.values()],
            }],
            "producerDataSet": [],
        }).encode()

    async def heartbeat(self, addresses: Iterable[str] | None = None) -> None:
        """HEART_BEAT to ``addresses`` (default: every broker, slaves included, of every
        known route: a pull may go to a slave, seed 000)."""
        body = self._heartbeat_body()
        for addr in self._routes.all_addresses() if addresses is None else addresses:
            try:
                await self._pool.call(addr, RemotingCommand.request(
                    RequestCode.HEART_BEAT, body=body), "heartbeat")
                self._told.add(addr)
            except (ClientError, TransportError) as exc:
                log.warning("heartbeat failed", addr=addr, error=str(exc))

    async def unregister(self) -> None:
        for addr in self._routes.all_addresses():
            try:
                await self._pool.invoke(addr, RemotingCommand.request(
                    RequestCode.UNREGISTER_CLIENT, UnregisterClientRequest.write(
                        client_id=self.client_id, consumer_group=self.group)))
            except TransportError as exc:
                log.warning("unregister failed", addr=addr, error=str(exc))

    async def member_ids(self, addr: str) -> list[str]:
        """The group's client ids as ``addr`` lists them; none when it knows no member yet
        (it answers SYSTEM_ERROR "no consumer for this group")."""
        try:
            answer = await self._pool.call(addr, RemotingCommand.request(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                GetConsumerListByGroupRequest.write(consumer_group=self.group)),
                "consumer list")
        except BrokerRefused as exc:
            if exc.code != ResponseCode.SYSTEM_ERROR:
                raise
            return []
        try:
            return [str(i) for i in json.loads(answer.body)["consumerIdList"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"unreadable consumer list from {addr}: {exc!r}") from None

    async def assignment(self, topic: str) -> set[MessageQueue] | None:
        """The queues of ``topic`` this member should own now; None when that cannot be known
        yet (no route, or the broker does not list this member), for the caller to retry soon
        and keep what it has meanwhile."""
        try:
            route = await self._routes.route(topic)
        except RouteNotFound:
            log.info("rebalance: no route yet", topic=topic)
            return None
        except (ClientError, TransportError) as exc:
            log.warning("rebalance: no route", topic=topic, error=str(exc))
            return None
        queues = route.subscribe_queues()
        if self.model is MessageModel.BROADCASTING or not queues:
            return set(queues)
        addr = self.offset_address(queues[0].broker_name)
        if addr is None:
            log.warning("rebalance: no broker to ask for the members", topic=topic)
            return None
        try:
            ids = [] if addr not in self._told else await self.member_ids(addr)
            if self.client_id not in ids:  # never told, or the broker forgot (restart, expiry)
                await self.heartbeat([addr])
                ids = await self.member_ids(addr)
            if self.client_id not in ids:
                raise ClientError(f"{addr} does not list {self.client_id!r} yet")
            return set(allocate(self._strategy, self.group, self.client_id, queues, ids))
        except (AllocationError, ClientError, TransportError) as exc:
            self._told.discard(addr)
            log.info("rebalance: no allocation yet", topic=topic, error=str(exc))
            return None

    # -- reading and committing -------------------------------------------------------------

    def offset_address(self, broker_name: str) -> str | None:
        """Where the group's offsets of ``broker_name``'s queues are read and committed (and
        members listed): the master, or a live slave while the master is unreachable."""
        return self._brokers.offset_target(self._routes.group_addresses(broker_name))

    async def pull(self, queue: MessageQueue, offset: int, sub: Subscription, *, max_nums: int,
                   suspend_ms: int, timeout: float, commit_offset: int = -1) -> PullResult:
        """PULL_MESSAGE to the broker of ``queue``'s group that seed 000 picks: the one the
        queue's last answer suggested, else the master, else a slave; a slave is not sent
        ``commit_offset`` (it keeps only commits made to it as such).  A broker that fails at
        the transport level is marked down and the rest of the group is tried at once, so a
        dead master costs one failed request rather than a failed pull."""
        addrs = self._routes.group_addresses(queue.broker_name)
        while (target := self._brokers.pull_target(queue, addrs)) is not None:
            broker_id, addr = target
            try:
                answer = await self._pool.invoke(addr, pull_request(
                    self.group, queue, offset, sub, max_nums=max_nums, suspend_ms=suspend_ms,
                    commit_offset=commit_offset if broker_id == MASTER_ID else -1), timeout)
            except TransportError:
                self._brokers.failed(addr)
                del addrs[broker_id]
                if not addrs:
                    raise
                continue
            return self._pulled(queue, sub, answer)
        raise ClientError(f"broker {queue.broker_name!r} has no address in the routes")

    def pull_now(self, queue: MessageQueue, offset: int, sub: Subscription,
                 lines: BlockingLines, *, max_nums: int, suspend_ms: int, timeout: float
                 ) -> PullResult | None:
        """The first attempt of :meth:`pull` (with no ``commit_offset``) made on the calling
        thread over one of ``lines``, for a caller that may block: the result, or None when
        it was not made (no address, no line to spare) or the broker failed at the
        transport.  That broker is then marked down as :meth:`pull` marks it, so the loop's
        pull that follows goes on with the rest of the group.

        Reads the routes and writes only the broker choice, both safe to share with the
        loop's thread (each read or write is one step on a dict)."""
        target = self._brokers.pull_target(queue, self._routes.group_addresses(queue.broker_name))
        if target is None:
            return None
        addr = target[1]
        request = pull_request(self.group, queue, offset, sub, max_nums=max_nums,
                               suspend_ms=suspend_ms)

        def made(opaque: int) -> tuple[RemotingCommand, None]:
            request.opaque = opaque
            return request, None

        try:
            answer = lines.request(addr, made, timeout)
        except TransportError:
            self._brokers.failed(addr)
            return None
        return None if answer is None else self._pulled(queue, sub, answer)

    def _pulled(self, queue: MessageQueue, sub: Subscription, answer: RemotingCommand
                ) -> PullResult:
        """The pull's result, its suggestion for the queue's next pull remembered."""
        result = parse_pull(answer, sub)
        self._brokers.suggest(queue, result.suggest_which_broker_id)
        return result

    def broker_failed(self, addr: str) -> None:
        """Count ``addr`` as down for a while (a request to it failed at the transport)."""
        self._brokers.failed(addr)

    # -- messages and locks -----------------------------------------------------------------

    async def send_back(self, queue: MessageQueue, msg: Message, *, delay_level: int,
                        max_reconsume_times: int) -> bool:
        """Give ``msg`` back to its broker for redelivery through ``%RETRY%<group>`` (or to
        the DLQ: ``delay_level`` :data:`TO_DLQ`).  When that broker cannot take it back
        (down, refusing), the copy :func:`retry_message` makes is sent to whichever broker
        holds the retry topic; False when that failed too."""
        addr = self._routes.master(queue.broker_name)
        try:
            if addr is None:
                raise ClientError(f"broker {queue.broker_name!r} has no master in the route")
            await self._pool.call(addr, RemotingCommand.request(
                RequestCode.CONSUMER_SEND_MSG_BACK, ConsumerSendMsgBackRequest.write(
                    offset=msg.commit_log_offset, group=self.group, delay_level=delay_level,
                    origin_msg_id=offset_msg_id(msg.store_host, msg.commit_log_offset),
                    origin_topic=msg.topic, max_reconsume_times=max_reconsume_times,
                )), "send back")
            return True
        except (ClientError, TransportError) as exc:
            log.warning("send back failed; sending to the retry topic", queue=queue,
                        error=str(exc))
        # A message bound for the DLQ gets there too: its new reconsume count is past the limit.
        retry = retry_message(self.group, msg, delay_level=delay_level,
                              max_reconsume_times=max_reconsume_times)
        try:
            await (await self._retry_producer()).send(retry)
        except (ClientError, TransportError) as exc:
            log.warning("send to the retry topic failed", queue=queue, error=str(exc))
            return False
        return True

    async def _retry_producer(self) -> Producer:
        async with self._producer_started:  # failed send-backs come in bursts
            if self._producer is None:
                producer = Producer(INNER_PRODUCER_GROUP, self._namesrv,
                                    security=self._security)
                await producer.start()
                self._producer = producer
        return self._producer

    async def close(self) -> None:
        """Stop the retry producer, if a failed send-back started one."""
        if self._producer is not None:
            await self._producer.shutdown()
            self._producer = None

    def _lock_body(self, queues: Iterable[MessageQueue]) -> bytes:
        return json.dumps({"consumerGroup": self.group, "clientId": self.client_id,
                           "mqSet": [queue_json(q) for q in queues]}).encode()

    def _by_master(self, queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
        out: dict[str, list[MessageQueue]] = {}
        for q in queues:
            if (addr := self._routes.master(q.broker_name)) is not None:
                out.setdefault(addr, []).append(q)
        return out

    async def lock(self, queues: Iterable[MessageQueue]
                   ) -> tuple[set[MessageQueue], set[MessageQueue]]:
        """LOCK_BATCH_MQ on each queue's master: the queues this member now holds, and those a
        master refused (another member holds them).  Queues of a master that did not answer
        are in neither."""
        held: set[MessageQueue] = set()
        refused: set[MessageQueue] = set()
        for addr, batch in self._by_master(queues).items():
            try:
                answer = await self._pool.call(addr, RemotingCommand.request(
                    RequestCode.LOCK_BATCH_MQ, body=self._lock_body(batch)), "lock queues")
                granted = {MessageQueue(str(q["topic"]), str(q["brokerName"]), int(q["queueId"]))
                           for q in json.loads(answer.body)["lockOKMQSet"]}
            except (ClientError, TransportError) as exc:
                log.warning("lock failed", addr=addr, error=str(exc))
                continue
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("unreadable lock answer", addr=addr, error=repr(exc))
                continue
            held |= granted & set(batch)
            refused |= set(batch) - granted
        return held, refused

    async def unlock(self, queues: Iterable[MessageQueue]) -> None:
        for addr, batch in self._by_master(queues).items():
            try:
                await self._pool.call(addr, RemotingCommand.request(
                    RequestCode.UNLOCK_BATCH_MQ, body=self._lock_body(batch)), "unlock queues")
            except (ClientError, TransportError) as exc:
                log.warning("unlock failed", addr=addr, error=str(exc))


def rebalance_rounds(rebalance: Callable[[], Awaitable[bool]], wake: asyncio.Event,
                     period_s: float, *, settled: bool) -> Step:
    """The step of a member's rebalancing loop: run ``rebalance`` every ``period_s``, at once
    when ``wake`` is set, and, after a round that did not settle (or failed), again after
    0.1 s, 0.2 s, 0.4 s ... (at most ``period_s``)."""
    backoff = UNSETTLED_FIRST_RETRY_S

    async def step() -> bool:
        nonlocal settled, backoff
        try:
            async with asyncio.timeout(period_s if settled else backoff):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()
        settled = False  # until the round says otherwise: one that raises did not settle
        try:
            settled = await rebalance()
        except (ClientError, TransportError) as exc:
            log.warning("rebalance failed", error=str(exc))
        finally:
            backoff = UNSETTLED_FIRST_RETRY_S if settled else min(backoff * 2, period_s)
        return True

    return step


async def settle(rebalance: Callable[[], Awaitable[bool]]) -> bool:
    """The first rounds of a starting consumer, a few quick tries; whether it settled."""
    delay = UNSETTLED_FIRST_RETRY_S
    settled = await rebalance()
    for _ in range(START_SETTLE_TRIES - 1):
        if settled:
            break
        await asyncio.sleep(delay)
        delay *= 2
        settled = await rebalance()
    return settled
