"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final, cast

import attrs

from evq.domain import sent
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import Broker, SendResult, sent_result
from evq.domain.codes import PUT_STATUS_CODES, BrokerError, ResponseCode
from evq.domain.compression import InflateError, inflate
from evq.domain.log import AppendedRecords, AppendResult, PutStatus
from evq.domain.message import Host, host_bytes, is_ipv6
from evq.domain.record import RecordError
from evq.domain.sent import SentEntry, sent_batch
from evq.net import execution, send_header
from evq.net.broker.context import BrokerContext, LaneHandler, parse_host
from evq.net.codes import RequestCode
from evq.net.headers.send import SendResponse
from evq.net.protocol import EVQ_LANGUAGE, EVQ_VERSION, RemotingCommand, SerializeType
from evq.net.send_header import SendHeader
from evq.net.transport import Connection, Handler, Reply


def entries_of(h: SendHeader, body: bytes, limit: int) -> list[SentEntry]:
    """The request's messages as sent; a batch is decoded (and inflated) here.  A batch's
    whole body is held to ``limit`` (maxMessageSize), as RocketMQ holds it, inflated or not:
    a 1 MiB zlib bomb once asked for 2 GiB, and a frame of empty messages held the loop.
    Work in proportion to a batch's entries: a large batch's runs off the loop (see
    :func:`put_large_request`)."""
    sysflag = h.sys_flag
    if not h.batch:
        return [(h.flag, body, sysflag, h.properties)]
    if len(h.topic) > tp.MAX_TOPIC_LENGTH:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "topic of a batch is too long")
    if len(body) > limit:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                          f"batch body size {len(body)} exceeds the maximum {limit}")
    try:
        if sysflag & sf.COMPRESSED:  # the C++ client deflates a whole batch over 4 KiB
            body = inflate(body, limit)
        entries = sent_batch(body, sysflag)
    except (RecordError, InflateError) as exc:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
    if not entries:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "a batch without messages")
    return entries


@attrs.define(slots=True)
class Stored:
    """What a send's answer, its waits and the broker's stats take from its put.  Taken where
    the put ran (a worker thread for a large one), so that the loop never holds a large
    batch's objects, nor pays for collecting them.  Not frozen: one is built per send, and a
    frozen class's constructor costs a microsecond more; nothing changes one once made."""

    status: PutStatus
    queue_id: int
    queue_offset: int
    end_offset: int
    msg_id: str | None  # None: nothing was stored, the answer is a refusal
    count: int
    size: int
    wait: bool  # the producer waits for the store (WAIT), read before routing strips it

    @property
    def code(self) -> ResponseCode:
        return PUT_STATUS_CODES[self.status]

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


def put_request(core: Broker, h: SendHeader, body: bytes, born_host: Host) -> Stored:
    """One send request's messages, put, and what the answer needs of the put."""
    result, wait = core.put_sent(
        h.topic, entries_of(h, body, core.config.max_message_size), queue_id=h.queue_id,
        born_timestamp=h.born_timestamp, born_host=born_host, reconsume_times=h.reconsume_times,
        default_topic=h.default_topic, default_topic_queue_nums=h.default_topic_queue_nums,
        max_reconsume_times=h.max_reconsume_times)
    return stored_of(result, wait)


def stored_of(result: SendResult, wait: bool) -> Stored:
    first_physical, queue_offset, end_offset, msg_id, count, size = result.summary()
    if first_physical < 0:
        return Stored(result.status, result.queue_id, -1, 0, None, 0, 0, wait)
    return Stored(result.status, result.queue_id, queue_offset, end_offset, msg_id, count, size,
                  wait)


def put_large_request(core: Broker, h: SendHeader, body: bytes, born_host: Host) -> Stored:
    """:func:`put_request` for a large batch, in a worker thread with the cycle collector
    paused: a 4 MiB batch of empty messages makes about a million objects, and each full
    collection while they live (one per quarter of growth) held the GIL, so the loop, for up
    to 0.16 s.  They are acyclic; reference counting frees them before this returns."""
    with execution.collector_paused():
        return put_request(core, h, body, born_host)


async def durable(ctx: BrokerContext, stored: Stored) -> Stored:
    """Wait for the flush policy without blocking the loop (group commit, one flusher request
    a round).  Under ASYNC_FLUSH there is nothing to wait for, and no thread hop is paid."""
    if not stored.ok or ctx.durable is None:
        return stored
    if await ctx.durable.wait(stored.end_offset):
        return stored
    return attrs.evolve(stored, status=PutStatus.FLUSH_DISK_TIMEOUT)


async def replicated(ctx: BrokerContext, stored: Stored) -> Stored:
    """SYNC_MASTER: acknowledge only what a slave holds (RocketMQ's handleHA); the message
    is stored either way, the code tells the producer whether a slave has it."""
    if ctx.replicated is None or not stored.ok or not stored.wait:
        return stored
    status = await ctx.replicated(stored.end_offset, ctx.core.config.sync_flush_timeout_ms / 1000)
    if status is PutStatus.PUT_OK:
        return stored
    return attrs.evolve(stored, status=status)


def response_to(core: Broker, cmd: RemotingCommand, stored: Stored) -> RemotingCommand:
    """A send's answer (the caller counts it in the stats)."""
    if stored.msg_id is None:
        return cmd.response(stored.code, core.refusal_remark(stored.status))
    return stored_response(cmd, stored)


def stored_response(cmd: RemotingCommand, stored: Stored) -> RemotingCommand:
    """The answer to a send whose messages were stored."""
    return cmd.response(stored.code, None, SendResponse.write(
        msg_id=stored.msg_id, queue_id=stored.queue_id, queue_offset=stored.queue_offset,
    ))


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    def send(conn: Connection, cmd: RemotingCommand) -> Awaitable[Reply] | Reply:
        """Answers at once in the common case: a put on the loop, nothing to wait for."""
        h = send_header.parse(cmd.code, cmd.version, cmd.ext_fields)
        core, born_host, body = ctx.core, parse_host(conn.peer), cmd.body
        writes = core.put_writes_metadata(h.topic)  # creating a topic or group: waits on disk
        if writes or (h.batch and len(body) >= execution.LARGE_WORK):
            put = put_large_request if h.batch else put_request
            return answer_later(cmd, ctx.puts.off_loop(lambda: put(core, h, body, born_host)),
                                topics_changed=writes)
        if ctx.puts.busy:  # after the large put before it
            return answer_later(cmd, ctx.puts.inline(
                lambda: put_request(core, h, body, born_host)))
        stored = put_request(core, h, body, born_host)
        if ctx.durable is None and ctx.replicated is None:
            return answer(cmd, stored)
        return answer_later(cmd, stored)

    async def answer_later(cmd: RemotingCommand, put: Awaitable[Stored] | Stored, *,
                           topics_changed: bool = False) -> Reply:
        """The answer once the put is done (``put``: a put still to run, or its result) and
        the flush policy and the slaves allow it."""
        stored = put if isinstance(put, Stored) else await put
        if topics_changed:
            ctx.topics_changed()
        return answer(cmd, await replicated(ctx, await durable(ctx, stored)))

    def answer(cmd: RemotingCommand, stored: Stored) -> RemotingCommand:
        if stored.ok:
            ctx.stats.messages_put += stored.count
            ctx.stats.bytes_put += stored.size
        else:
            ctx.stats.puts_refused += 1
        return response_to(ctx.core, cmd, stored)

    def answer_put(cmd: RemotingCommand, topic: str, queue_id: int,
                   appended: Sequence[AppendResult]) -> RemotingCommand:
        """The answer to a single send the lane appended but does not answer itself."""
        return answer(cmd, stored_of(sent_result(topic, queue_id, appended), False))

    lane = ctx.send_lane = send_lane(ctx, send, answer_put)
    single = lane or send
    return {RequestCode.SEND_MESSAGE: single, RequestCode.SEND_MESSAGE_V2: single,
            RequestCode.SEND_BATCH_MESSAGE: send}


# Values no real answer carries, where the lane's answer template is cut.
_MARKS: Final = ("0123456789ABCDEFFEDCBA9876543210", 1357913579, 2468024680246802, 1975318642)


def _marked_answer(serialize_type: SerializeType) -> RemotingCommand:
    """The processor's answer to a stored single send of ``serialize_type``, the marks in
    its values."""
    msg_id, queue_id, queue_offset, opaque = _MARKS
    request = RemotingCommand.direct(RequestCode.SEND_MESSAGE_V2, EVQ_LANGUAGE, EVQ_VERSION,
                                     opaque, 0, None, {}, b"", serialize_type)
    return stored_response(request, Stored(PutStatus.PUT_OK, queue_id, queue_offset, 0, msg_id,
                                           1, 0, False))


def answer_template() -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """The header of the processor's answer to a stored single send with a JSON header, as
    the lane splices it: its literal pieces, and which value (msgId, queueId, queueOffset,
    opaque) follows each.  Written by :func:`stored_response` and the frame encoder, so the
    lane writes what they write; a value that does not show exactly once stops the lane from
    being built."""
    header = _marked_answer(SerializeType.JSON).encode()[8:]
    marks = [str(m).encode() for m in _MARKS]
    if any(header.count(m) != 1 for m in marks):
        raise RuntimeError(f"the send's answer has no place for each value: {header!r}")
    order = sorted(range(len(marks)), key=lambda k: header.index(marks[k]))
    pieces, at = [], 0
    for k in order:
        start = header.index(marks[k])
        pieces.append(header[at:start])
        at = start + len(marks[k])
    pieces.append(header[at:])
    return tuple(pieces), tuple(order)


BinaryTemplate = tuple[tuple[int, int, int, int], tuple[tuple[bytes, bytes | int], ...]]
"""The answer to a ROCKETMQ send: its code, language, version and flag, then each header
field's key and either its literal value (UTF-8) or which value (msgId, queueId,
queueOffset) goes there."""


def binary_answer_template() -> BinaryTemplate:
    """The processor's answer to a stored single send with a ROCKETMQ header, as the lane
    writes it (with the frame kernels' ROCKETMQ writer, the encoder's own): the opaque in
    its fixed field, each other value where :func:`stored_response` puts it.  A value that
    is not one field's, or a remark, stops the lane from being built."""
    answer = _marked_answer(SerializeType.ROCKETMQ)
    marks = {str(m): k for k, m in enumerate(_MARKS[:3])}
    values = list(answer.ext_fields.values())
    if (answer.remark is not None or answer.opaque != _MARKS[3]
            or sorted(marks) != sorted(v for v in values if v in marks)):
        raise RuntimeError(f"the send's answer has no place for each value: {answer!r}")
    return ((int(answer.code), int(answer.language), int(answer.version), int(answer.flag)),
            tuple((key.encode(), marks.get(value, value.encode()))
                  for key, value in answer.ext_fields.items()))


def send_lane(ctx: BrokerContext, general: Handler,
              answer_put: Callable[[RemotingCommand, str, int, Sequence[AppendResult]], Reply]
              ) -> LaneHandler | None:
    """The compiled send lane in front of ``general`` (:mod:`evq.net.broker.send_lane`), or
    None where it is not built or not wanted (the frame kernels' switch, ``EVQ_PURE_PYTHON``),
    or the plain path is off for this broker (an IPv6 store host)."""
    terms = ctx.core.plain_send_terms()
    if send_header.COMPILED_PARSE is None or sent.COMPILED_SENT is None or terms is None:
        return None
    try:
        from evq.net.broker.send_lane import SendLane
    except ImportError:
        return None
    return cast(LaneHandler, SendLane(
        general=general, ctx=ctx, answer_put=answer_put, plain_records=sent.plain_records,
        parse_host=parse_host, host_bytes=host_bytes, is_ipv6=is_ipv6,
        appended_records=AppendedRecords, terms=terms, template=answer_template(),
        binary_template=binary_answer_template(), v1_code=RequestCode.SEND_MESSAGE,
        v2_code=RequestCode.SEND_MESSAGE_V2, json_type=SerializeType.JSON,
        rocketmq_type=SerializeType.ROCKETMQ, command=RemotingCommand))
