"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320)."""

from __future__ import annotations

from collections.abc import Awaitable

import attrs

from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import Broker
from evq.domain.codes import PUT_STATUS_CODES, BrokerError, ResponseCode
from evq.domain.compression import InflateError, inflate
from evq.domain.log import PutStatus
from evq.domain.message import Host
from evq.domain.record import RecordError
from evq.domain.sent import SentEntry, sent_batch
from evq.net import execution, send_header
from evq.net.broker.context import BrokerContext, parse_host
from evq.net.codes import RequestCode
from evq.net.headers.send import SendResponse
from evq.net.protocol import RemotingCommand
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
        if stored.msg_id is None:
            return cmd.response(stored.code, ctx.core.refusal_remark(stored.status))
        return cmd.response(stored.code, None, SendResponse.write(
            msg_id=stored.msg_id, queue_id=stored.queue_id, queue_offset=stored.queue_offset,
        ))

    return {RequestCode.SEND_MESSAGE: send, RequestCode.SEND_MESSAGE_V2: send,
            RequestCode.SEND_BATCH_MESSAGE: send}
