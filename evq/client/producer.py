"""The producer: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE to the master of a chosen queue.

A send picks a queue round-robin, skipping brokers the latency table (:mod:`evq.client.faults`)
is avoiding and, on a retry, the broker that just failed; transport failures and the broker
answers Java retries on are tried again up to ``retries`` times.  Orderly sends pick the queue
by key (``abs(javaHash(key)) % n``, the hash selector of the Java and C++ clients, unless the
caller passes its own :data:`QueueSelector`) and are not retried elsewhere, since another queue
would break the order.

Messages are built with :func:`evq.domain.message.new_message` (tags, keys, properties,
compression over 4 KiB); :func:`delayed` and :func:`deliver_at` add the scheduling properties.

A producer heart-beats its group to every master it knows (at start, every 30 s, and before
its first send to a broker): a broker asks only a producer it has heard from about a
transaction it cannot decide (:mod:`evq.client.transactions`).
"""

from __future__ import annotations

import enum
import functools
import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import attrs

from evq import logs
from evq.client.direct import BlockingLines, MadeRequest
from evq.client.errors import BrokerRefused, ClientError, NotStarted, SendFailed
from evq.client.faults import LatencyFaultTolerance, select_queue
from evq.client.identity import new_client_id
from evq.client.routes import REFRESH_S, BrokerPool, Routes, TopicRoute
from evq.client.supervision import SupervisionPolicy, Supervisor, periodic
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.codes import ResponseCode
from evq.domain.hashing import java_hash
from evq.domain.ids import new_uniq_key, new_uniq_keys
from evq.domain.message import Message, Prop, encode_properties
from evq.domain.queues import MessageQueue
from evq.domain.record import PURE_PYTHON_VARIABLE, encode_batch
from evq.net.codes import RequestCode
from evq.net.headers.clients import UnregisterClientRequest
from evq.net.headers.send import SendResponse
from evq.net.protocol import (
    EVQ_LANGUAGE,
    EVQ_VERSION,
    RemotingCommand,
    SerializeType,
    parse_int_field,
    parse_long_field,
    serialization_for,
)
from evq.net.security import ClientSecurity
from evq.net.transport import Dispatcher, Handler, TransportError

log = logs.get_logger(__name__)

SEND_TIMEOUT_S: Final = 3.0
HEARTBEAT_S: Final = 30.0
RETRYABLE: Final = frozenset({ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE,
                              ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY,
                              ResponseCode.NO_PERMISSION})
"""Answers Java's producer tries again elsewhere: the next broker may well accept."""
_SEND: Final = RequestCode.SEND_MESSAGE_V2
_SEND_BATCH: Final = RequestCode.SEND_BATCH_MESSAGE


class SendStatus(enum.Enum):
    SEND_OK = ResponseCode.SUCCESS
    FLUSH_DISK_TIMEOUT = ResponseCode.FLUSH_DISK_TIMEOUT
    FLUSH_SLAVE_TIMEOUT = ResponseCode.FLUSH_SLAVE_TIMEOUT
    SLAVE_NOT_AVAILABLE = ResponseCode.SLAVE_NOT_AVAILABLE


STATUS_OF_CODE: Final = {s.value: s for s in SendStatus}
"""Codes that mean the message is stored (the non-OK ones say how durable it is); a dict, as
looking a code up in it costs a fraction of calling the enum."""


@attrs.frozen(slots=True)
class SendResult:
    status: SendStatus
    msg_id: str
    """The UNIQ_KEY (comma-joined for a batch): the id a producer logs and queries by."""
    offset_msg_id: str
    """Store host and commit-log offset, as the broker answered."""
    queue: MessageQueue
    queue_offset: int


def delayed(msg: Message, level: int) -> Message:
    """``msg`` delivered after delay level ``level`` (1 = 1 s ... 18 = 2 h by default)."""
    if level <= 0:
        raise ValueError(f"delay level must be positive, got {level}")
    msg.properties[Prop.DELAY] = str(level)
    return msg


def deliver_at(msg: Message, when_ms: int) -> Message:
    """``msg`` delivered at the epoch milliseconds ``when_ms`` (the timer's property)."""
    msg.properties[Prop.START_DELIVER_TIME] = str(when_ms)
    return msg


QueueSelector = Callable[[Sequence[MessageQueue], Message, str], MessageQueue]
"""Java's ``MessageQueueSelector``: picks one of a topic's publish queues for a message and
its key."""


def order_queue(queues: Sequence[MessageQueue], key: str) -> MessageQueue:
    """The queue of ``key``: ``abs(javaHash(key)) % n`` over the sorted publish queues."""
    if not queues:
        raise ClientError("no queue to send to")
    return queues[abs(java_hash(key)) % len(queues)]


Publishing = tuple[TopicRoute, list[MessageQueue], dict[str, str | None]]
"""A topic's route, its publish queues and the master address of each of their brokers (None
for a broker the route names no master of): what a send looks up, once per route."""


@attrs.frozen(slots=True)
class Attempts:
    """What a send tried before the loop took it over (:meth:`Producer.send_now`)."""

    tried: int = 0
    last_failed: str | None = None
    """The broker of the last failed attempt, which the next one avoids."""
    cause: Exception | None = None


NOT_TRIED: Final = Attempts()


class Producer:
    """``await start()``, then ``await send(msg)``; ``await shutdown()`` at the end.

    Runs on its event loop, but for :meth:`send_now`, which a synchronous caller runs on its
    own thread."""

    def __init__(self, group: str, namesrv: str, *, retries: int = 2,
                 send_timeout: float = SEND_TIMEOUT_S, route_refresh_s: float = REFRESH_S,
                 heartbeat_s: float = HEARTBEAT_S, client_id: str | None = None,
                 clock: Clock = SYSTEM_CLOCK, supervision: SupervisionPolicy | None = None,
                 security: ClientSecurity | None = None) -> None:
        """``security`` signs every request (an ACL-enabled cluster needs credentials) and
        may open the connections over TLS."""
        self.group = group
        self.security = security
        self.client_id = client_id or new_client_id()
        self.heartbeat_s = heartbeat_s
        self.route_refresh_s = route_refresh_s
        self.retries = retries
        self.send_timeout = send_timeout
        self._namesrv = namesrv
        self._clock = clock
        self._faults = LatencyFaultTolerance(clock)
        self._counter = itertools.count()
        self._routes: Routes | None = None
        self._pool: BrokerPool | None = None
        self._supervision = supervision or SupervisionPolicy()
        self._supervisor: Supervisor | None = None
        """Runs heartbeats and route refresh; sends raise once either failed for good."""
        self._greeted: set[str] = set()
        self._publish: dict[str, Publishing] = {}
        """Each topic's publish queues and their masters, worked out once per route (a refresh
        replaces the route object, and they are worked out again on the next send)."""

    def handlers(self) -> Mapping[int, Handler]:
        """Requests brokers send this producer; :class:`TransactionProducer` answers
        CHECK_TRANSACTION_STATE."""
        return {}

    async def start(self) -> None:
        self._routes = Routes(self._namesrv, self._clock, security=self.security)
        self._pool = BrokerPool(Dispatcher(self.handlers()), self._clock,
                                security=self.security)
        await self._greet_brokers()
        self._supervisor = supervisor = Supervisor(f"producer {self.group}", self._supervision)
        supervisor.loop("refresh routes", periodic(self.route_refresh_s, self.refresh_routes))
        supervisor.loop("heartbeat", periodic(self.heartbeat_s, self.heartbeat))

    async def shutdown(self) -> None:
        if self._supervisor is not None:
            await self._supervisor.close()
        if self._routes is not None and self._pool is not None:
            await self._unregister()
            await self._pool.close()
            await self._routes.close()
        self._routes = self._pool = None

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    @property
    def faults(self) -> LatencyFaultTolerance:
        return self._faults

    async def refresh_routes(self) -> None:
        """Re-read every route in use (done every ``route_refresh_s`` after start), and
        greet a master the routes name for the first time: it may hold halves to check."""
        routes, _ = self._started()
        await routes.refresh()
        await self.heartbeat(only_new=True)

    async def heartbeat(self, *, only_new: bool = False) -> None:
        """Tell every known master (or only those not greeted yet) this producer of
        ``group`` is alive; a failure is logged: the next round or the next send tries
        again."""
        routes, _ = self._started()
        for addr in routes.masters():
            if only_new and addr in self._greeted:
                continue
            try:
                await self._heartbeat_to(addr)
            except (BrokerRefused, TransportError) as exc:
                log.warning("heartbeat failed", addr=addr, error=str(exc))

    async def _greet_brokers(self) -> None:
        """Heart-beat every broker before the first send, as Java's producer does through the
        route of ``TBW102``: a producer that took over a dead member's group must be known to
        the brokers holding that member's halves before it sends anything itself."""
        routes, _ = self._started()
        try:
            await routes.route(tp.AUTO_CREATE_TOPIC)
        except (ClientError, TransportError) as exc:  # auto-creation off, or no name server yet
            log.info("no broker known at start", error=str(exc))
        await self.heartbeat()

    async def _heartbeat_to(self, addr: str) -> None:
        _, pool = self._started()
        body = json.dumps({"clientID": self.client_id, "consumerDataSet": [],
                           "producerDataSet": [{"groupName": self.group}]}).encode()
        await pool.call(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=body),
                        "heartbeat")
        self._greeted.add(addr)

    async def _unregister(self) -> None:
        _, pool = self._started()
        for addr in sorted(self._greeted):
            try:
                await pool.invoke(addr, RemotingCommand.request(
                    RequestCode.UNREGISTER_CLIENT, UnregisterClientRequest.write(
                        client_id=self.client_id, producer_group=self.group)))
            except TransportError as exc:
                log.warning("unregister failed", addr=addr, error=str(exc))
        self._greeted.clear()

    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        return list((await self._publishing(topic))[1])

    async def _publishing(self, topic: str) -> Publishing:
        """The topic's route (looked up when missing), its publish queues, sorted, and the
        master of each of their brokers: worked out once per route."""
        routes, _ = self._started()
        route = await routes.route(topic, fallback=True)
        known = self._publish.get(topic)
        if known is None or known[0] is not route:
            queues = route.publish_queues()
            known = self._publish[topic] = (
                route, queues, {q.broker_name: route.master(q.broker_name) for q in queues})
        return known

    # -- sending ------------------------------------------------------------------------------

    async def send(self, msg: Message) -> SendResult:
        self._prepare(msg)
        return await self._send(msg.topic, [msg], False)

    async def send_batch(self, msgs: Sequence[Message]) -> SendResult:
        """One request for several messages of one topic; each keeps its own UNIQ_KEY."""
        self._prepare(*_batch_of(msgs))
        return await self._send(msgs[0].topic, list(msgs), True)

    async def send_orderly(self, msg: Message, key: str,
                           selector: QueueSelector | None = None) -> SendResult:
        """To the queue of ``key`` (:func:`order_queue`, or the one ``selector`` picks from
        the publish queues), so that messages with one key are consumed in order."""
        self._prepare(msg)
        _, queues, _ = await self._publishing(msg.topic)
        queue = order_queue(queues, key) if selector is None else selector(queues, msg, key)
        if queue not in queues:
            raise ClientError(f"the selector picked {queue}, not a publish queue of "
                              f"{msg.topic!r}")
        return await self._send(msg.topic, [msg], False, queue)

    async def send_to_queue(self, msg: Message, queue_id: int) -> SendResult:
        """To queue ``queue_id`` of the topic's publish queues (in route order); no retry
        elsewhere, since the caller chose the queue."""
        self._prepare(msg)
        _, publish, _ = await self._publishing(msg.topic)
        queues = [q for q in publish if q.queue_id == queue_id]
        if not queues:
            raise ClientError(f"topic {msg.topic!r} has no writable queue {queue_id}")
        return await self._send(msg.topic, [msg], False, queues[0])

    async def send_oneway(self, msg: Message) -> None:
        """Fire and forget: no answer, no retry, no result."""
        self._prepare(msg)
        _, pool = self._started()
        route, queues, _ = await self._publishing(msg.topic)
        queue = select_queue(queues, next(self._counter), self._faults)
        cmd = send_command(self.group, queue, [msg], batch=False)
        await pool.client(self._master(route.master(queue.broker_name), queue)).invoke_oneway(cmd)

    def _prepare(self, *msgs: Message) -> None:
        """Stamp each message's UNIQ_KEY (unless the caller chose one) and birth time."""
        supervisor = self._supervisor
        if supervisor is None or supervisor.failed:  # read here, not called: every send asks
            self._supervised().check()  # raises: a producer whose background work died is done
        now = self._clock.now_ms()
        if len(msgs) == 1:
            (msg,) = msgs
            if Prop.UNIQ_KEY not in msg.properties:
                msg.properties[Prop.UNIQ_KEY] = new_uniq_key(now)
            msg.born_timestamp = now
            return
        # A batch takes its keys in one call: one lock and one formatted head for all.
        keyless = [msg for msg in msgs if Prop.UNIQ_KEY not in msg.properties]
        for msg, key in zip(keyless, new_uniq_keys(now, len(keyless)), strict=True):
            msg.properties[Prop.UNIQ_KEY] = key
        for msg in msgs:
            msg.born_timestamp = now

    def send_now(self, msgs: Sequence[Message], lines: BlockingLines, *, batch: bool = False
                 ) -> SendResult | Attempts:
        """The first attempt of :meth:`send` of the one message in ``msgs`` (or of
        :meth:`send_batch` of ``msgs``) made on the calling thread over one of ``lines``,
        for a caller that may block (:class:`~evq.client.blocking.SyncProducer`): the
        result, or the :class:`Attempts` :meth:`send_after` goes on from on the loop.

        Only a send whose topic's route and broker greeting the loop has already worked out
        is tried here (and only while ``lines`` has a line to spare); the rest is
        :data:`NOT_TRIED`.  So this reads the loop's state (a route, a set, a dict: each read
        in one step) and writes only the fault table, which is safe to share
        (:class:`LatencyFaultTolerance`), and the round-robin counter (a C iterator)."""
        self._prepare(*(_batch_of(msgs) if batch else msgs))
        topic = msgs[0].topic
        known = self._publish.get(topic)
        routes = self._routes
        if known is None or routes is None or known[0] is not routes.cached(topic) \
                or not known[1]:
            return NOT_TRIED
        _, queues, masters = known
        faults = self._faults
        queue = select_queue(queues, next(self._counter), faults)
        addr = masters.get(queue.broker_name)
        if addr is None or addr not in self._greeted:
            return NOT_TRIED
        started = self._clock.monotonic()
        try:
            try:
                answer = lines.request(addr, self._maker(queue, msgs, batch))
            except TransportError:
                faults.update(queue.broker_name, 0, failed=True)
                raise
            if answer is None:
                return NOT_TRIED
            return self._answered(queue, msgs, batch, answer, started, addr)
        except (TransportError, BrokerRefused) as exc:
            if not self._may_retry(exc, None, topic, queue, 0):
                raise
            return Attempts(1, queue.broker_name, exc)

    async def send_after(self, msgs: Sequence[Message], attempts: Attempts, *,
                         batch: bool = False) -> SendResult:
        """What :meth:`send_now` of the same arguments began, after its ``attempts``."""
        return await self._send(msgs[0].topic, list(msgs), batch, after=attempts)

    async def _send(self, topic: str, msgs: list[Message], batch: bool,
                    chosen: MessageQueue | None = None, after: Attempts = NOT_TRIED
                    ) -> SendResult:
        """Send ``msgs`` (stamped) to a queue of ``topic`` picked round-robin past the brokers
        being avoided, trying again elsewhere up to ``retries`` times; or to the ``chosen``
        queue, once, its failure raised as it is (an orderly or queue-addressed send).
        ``after`` is what :meth:`send_now` tried already.

        One coroutine for the retries and the attempt: a sync send's answer passes up through
        every coroutine frame around the wait, and each was a dozen-odd bytecodes a send.  A
        heartbeat that fails before the first send to a broker is retried like the send, but
        is no report of the broker's latency: the fault table sees only the send itself."""
        last_failed, cause = after.last_failed, after.cause
        faults = self._faults
        for attempt in range(after.tried, 1 if chosen is not None else 1 + self.retries):
            known = self._publish.get(topic)
            routes = self._routes  # None once shut down: _publishing then says so
            if known is None or routes is None or known[0] is not routes.cached(topic):
                known = await self._publishing(topic)
            route, queues, masters = known
            if chosen is not None:
                queue = chosen
            elif queues:
                queue = select_queue(queues, next(self._counter), faults, last_failed)
            else:
                raise SendFailed(f"topic {topic!r} has no writable queue")
            try:
                pool, addr = self._pool, masters.get(queue.broker_name)
                if pool is None or addr is None or addr not in self._greeted:
                    pool, addr = await self._greeted_master(route, queue)
                make = self._maker(queue, msgs, batch)
                started = self._clock.monotonic()
                try:
                    conn = pool.opened(addr) or await pool.connect(addr)
                    answer = await conn.send_made(make, self.send_timeout)
                except TransportError:
                    faults.update(queue.broker_name, 0, failed=True)
                    raise
                return self._answered(queue, msgs, batch, answer, started, addr)
            except (TransportError, BrokerRefused) as exc:
                if not self._may_retry(exc, chosen, topic, queue, attempt):
                    raise
                last_failed, cause = queue.broker_name, exc
        raise SendFailed(f"send to {topic!r} failed {1 + self.retries} times: {cause}"
                         ) from cause

    def _maker(self, queue: MessageQueue, msgs: Sequence[Message], batch: bool
               ) -> MadeRequest:
        """What makes the request of ``msgs`` to ``queue`` for a connection's opaque."""
        if batch:
            return functools.partial(_batch_request, self.group, queue, list(msgs))
        return functools.partial(send_request, self.group, queue, msgs[0])

    def _answered(self, queue: MessageQueue, msgs: Sequence[Message], batch: bool,
                  answer: RemotingCommand, started: float, addr: str) -> SendResult:
        """The result the broker's ``answer`` gives a send of ``msgs`` to ``queue`` begun at
        ``started`` (reported to the fault table with its latency); :class:`BrokerRefused`
        when the broker did not store them."""
        status = STATUS_OF_CODE.get(answer.code)
        self._faults.update(queue.broker_name,
                            round((self._clock.monotonic() - started) * 1000),
                            failed=status is None)
        if status is None:
            code = _SEND_BATCH if batch else _SEND
            raise BrokerRefused(answer.code, answer.remark, f"send {code.name} to {addr}")
        msg_id = (",".join(m.properties[Prop.UNIQ_KEY] for m in msgs) if batch
                  else msgs[0].properties[Prop.UNIQ_KEY])
        return send_result(status, msg_id, queue, answer.ext_fields)

    @staticmethod
    def _may_retry(exc: TransportError | BrokerRefused, chosen: MessageQueue | None,
                   topic: str, queue: MessageQueue, attempt: int) -> bool:
        """Whether a send that failed with ``exc`` may be tried again elsewhere: not to a
        queue the caller chose, nor after a refusal retrying cannot mend."""
        if chosen is not None or (isinstance(exc, BrokerRefused) and exc.code not in RETRYABLE):
            return False
        log.warning("send failed", topic=topic, broker=queue.broker_name, attempt=attempt,
                    error=str(exc))
        return True

    async def _greeted_master(self, route: TopicRoute, queue: MessageQueue
                              ) -> tuple[BrokerPool, str]:
        """The pool and the master of ``queue``'s broker, heart-beaten before the first send
        to it: what a send needs first, when it is not all known already."""
        _, pool = self._started()
        addr = self._master(route.master(queue.broker_name), queue)
        if addr not in self._greeted:
            await self._heartbeat_to(addr)
        return pool, addr

    @staticmethod
    def _master(addr: str | None, queue: MessageQueue) -> str:
        if addr is None:
            raise SendFailed(f"broker {queue.broker_name!r} has no master in the route")
        return addr

    def _started(self) -> tuple[Routes, BrokerPool]:
        if self._routes is None or self._pool is None:
            raise NotStarted(f"producer {self.group!r} is not started")
        return self._routes, self._pool

    def _supervised(self) -> Supervisor:
        if self._supervisor is None:
            raise NotStarted(f"producer {self.group!r} is not started")
        return self._supervisor


def _batch_of(msgs: Sequence[Message]) -> Sequence[Message]:
    """``msgs``, when they make a batch: some messages, all of one topic, none delayed."""
    if not msgs or len({m.topic for m in msgs}) != 1:
        raise ClientError("a batch needs at least one message, all of one topic")
    if any(Prop.DELAY in m.properties for m in msgs):
        raise ClientError("a batch cannot carry delayed messages")
    return msgs


def send_command(group: str, queue: MessageQueue, msgs: list[Message], *, batch: bool
                 ) -> RemotingCommand:
    """The SEND_MESSAGE_V2 (or SEND_BATCH_MESSAGE) a producer of ``group`` sends for
    ``msgs`` (stamped already: UNIQ_KEY, birth time) to ``queue``; its opaque is the
    connection's to set.

    Its header is RocketMQ's binary one where it can be (:func:`serialization_for`): a
    send is the request a producer makes most."""
    first = msgs[0]
    if batch:
        # The broker compresses each entry itself; a batch goes out uncompressed.
        body = encode_batch(attrs.evolve(m, body=m.payload()) if m.sysflag & sf.COMPRESSED
                            else m for m in msgs)
        sysflag, props = 0, ""
    else:
        body, sysflag, props = first.body, first.sysflag, encode_properties(first.properties)
    # Built as the strings the header carries and handed to the command as they are.
    fields = {
        "a": group, "b": queue.topic, "c": tp.AUTO_CREATE_TOPIC, "d": "4",
        "e": str(queue.queue_id), "f": str(sysflag & (sf.COMPRESSED | sf.TRANSACTION_MASK)),
        "g": str(first.born_timestamp), "h": str(first.flag), "i": props,
        "j": str(first.reconsume_times), "k": "false",
    }
    if batch:
        fields["m"] = "true"
    if queue.topic.startswith(tp.RETRY_PREFIX) and Prop.MAX_RECONSUME_TIMES in first.properties:
        # A consumer's own retry: the broker moves it to the DLQ past the consumer's limit.
        fields["l"] = str(int(first.properties[Prop.MAX_RECONSUME_TIMES]))
    return RemotingCommand.direct(_SEND_BATCH if batch else _SEND, EVQ_LANGUAGE,
                                  EVQ_VERSION, 0, 0, None, fields, body,
                                  serialization_for(fields))


def _batch_request(group: str, queue: MessageQueue, msgs: list[Message], opaque: int
                   ) -> tuple[RemotingCommand, None]:
    """The SEND_BATCH_MESSAGE of ``msgs`` with ``opaque``, for the connection to encode."""
    cmd = send_command(group, queue, msgs, batch=True)
    cmd.opaque = opaque
    return cmd, None


# -- compiled kernels --------------------------------------------------------------------------


def _send_request(group: str, queue: MessageQueue, msg: Message, opaque: int
                  ) -> tuple[RemotingCommand, bytes | None]:
    """The SEND_MESSAGE_V2 of ``msg`` (stamped already) to ``queue`` with ``opaque``, and its
    whole frame: what a producer's connection sends (:meth:`Connection.send_made`).  Pure:
    the reference of the compiled twin, which writes the same command and the same bytes."""
    cmd = send_command(group, queue, [msg], batch=False)
    cmd.opaque = opaque
    return cmd, cmd.encode()


def _send_result(status: SendStatus, msg_id: str, queue: MessageQueue,
                 fields: Mapping[str, str]) -> SendResult:
    """The result of a send to ``queue`` that the broker stored (``status``), its answer's
    header ``fields`` read as :class:`SendResponse`; the queue the broker names if it chose
    another.  Pure: the reference of the compiled twin."""
    h = SendResponse.read(fields)
    if h.queue_id is not None and h.queue_id != queue.queue_id:
        queue = MessageQueue(queue.topic, queue.broker_name, h.queue_id)
    return SendResult(status, msg_id, h.msg_id, queue, h.queue_offset)


SendRequest = Callable[[str, MessageQueue, Message, int], tuple[RemotingCommand, bytes | None]]
SendResultOf = Callable[[SendStatus, str, MessageQueue, Mapping[str, str]], SendResult]


@attrs.frozen(slots=True)
class SendKernels:
    """One implementation of a single send's two hot functions: the pure-Python ones above
    (the reference) or their compiled twins in evq/client/send_kernels.pyx."""

    send_request: SendRequest
    send_result: SendResultOf


PURE = SendKernels(_send_request, _send_result)


def _compiled_kernels() -> SendKernels | None:
    """The compiled kernels, bound to this module; None where they were not built or
    ``EVQ_PURE_PYTHON`` asks for pure Python (as for the frame kernels)."""
    if os.environ.get(PURE_PYTHON_VARIABLE, "0") not in ("", "0"):
        return None
    try:
        from evq.client import send_kernels
    except ImportError:
        return None
    send_kernels.bind(
        command=RemotingCommand, result=SendResult, queue=MessageQueue,
        pure_send_request=_send_request, pure_send_result=_send_result,
        parse_int_field=parse_int_field, parse_long_field=parse_long_field, code=_SEND,
        evq_language=EVQ_LANGUAGE, evq_version=EVQ_VERSION,
        rocketmq=SerializeType.ROCKETMQ, sysflag_bits=sf.COMPRESSED | sf.TRANSACTION_MASK,
        auto_create=tp.AUTO_CREATE_TOPIC, retry=tp.RETRY_PREFIX)
    return SendKernels(send_kernels.send_request, send_kernels.send_result)


COMPILED = _compiled_kernels()
"""The compiled kernels, or None where they are not built or not wanted."""
KERNELS = COMPILED or PURE
"""The kernels this process runs."""
send_request, send_result = KERNELS.send_request, KERNELS.send_result
