"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final, cast

from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import Broker, SendResult
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.compression import InflateError, inflate
from evq.domain.log import PutStatus
from evq.domain.message import COMPRESS_OVER, Host, Message, waits_for_store
from evq.domain.record import RecordError, split_batch
from evq.domain.sent import PlainMessage, SentEntry, sent_messages
from evq.net import execution, send_header
from evq.net.broker.context import BrokerContext, parse_host
from evq.net.codes import RequestCode
from evq.net.protocol import MAX_FRAME, RemotingCommand
from evq.net.send_header import SendHeader
from evq.net.transport import Connection, Handler

MAX_INFLATED_BATCH: Final = MAX_FRAME
"""A compressed batch may inflate to what an uncompressed request could carry, no more: a
1 MiB zlib bomb once asked for 2 GiB."""


def messages_of(core: Broker, h: SendHeader, body: bytes, born_host: Host
                ) -> list[PlainMessage] | list[Message]:
    """The request's messages for :meth:`Broker.put_plain` when it takes them all, else for
    :meth:`Broker.put`.  Work in proportion to a batch's entries, so this runs off the loop
    for large bodies (see :func:`evq.net.execution.sized`)."""
    entries = entries_of(h, body)
    plain = core.plain_messages(h.topic, born_host, entries)
    if plain is not None:
        return plain
    return sent_messages(h.topic, entries, queue_id=h.queue_id, born_timestamp=h.born_timestamp,
                         born_host=born_host, reconsume_times=h.reconsume_times)


def entries_of(h: SendHeader, body: bytes) -> list[SentEntry]:
    """The request's messages as sent; a batch is decoded (and inflated) here."""
    sysflag = h.sys_flag
    if not h.batch:
        return [(h.flag, body, sysflag, h.properties)]
    if len(h.topic) > tp.MAX_TOPIC_LENGTH:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "topic of a batch is too long")
    try:
        if sysflag & sf.COMPRESSED:  # the C++ client deflates a whole batch over 4 KiB
            body = inflate(body, MAX_INFLATED_BATCH)
        entries = split_batch(body)
    except (RecordError, InflateError) as exc:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
    if not entries:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "a batch without messages")
    # Each stored record carries its own compression flag, as a single send would.
    plain = sysflag & ~sf.COMPRESSED
    return [(flag, zlib.compress(b, 5), plain | sf.COMPRESSED, props)
            if len(b) >= COMPRESS_OVER else (flag, b, plain, props)
            for flag, b, props in entries]


async def durable(ctx: BrokerContext, result: SendResult) -> SendResult:
    """Wait for the flush policy without blocking the loop (group commit, one flusher request
    a round).  Under ASYNC_FLUSH there is nothing to wait for, and no thread hop is paid."""
    if not result.ok or ctx.durable is None:
        return result
    if await ctx.durable.wait(result.end_offset):
        return result
    return SendResult(PutStatus.FLUSH_DISK_TIMEOUT, result.topic, result.queue_id,
                      result.appended)


async def replicated(ctx: BrokerContext, result: SendResult, wait: bool = True) -> SendResult:
    """SYNC_MASTER: acknowledge only what a slave holds (RocketMQ's handleHA); the message
    is stored either way, the code tells the producer whether a slave has it."""
    if ctx.replicated is None or not result.ok or not wait:
        return result
    status = await ctx.replicated(result.end_offset, ctx.core.config.sync_flush_timeout_ms / 1000)
    if status is PutStatus.PUT_OK:
        return result
    return SendResult(status, result.topic, result.queue_id, result.appended)


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    async def send(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = send_header.parse(cmd.code, cmd.version, cmd.ext_fields)
        core, born_host = ctx.core, parse_host(conn.peer)
        # A single message's body is taken as it is (no work, no coroutine); a batch's is
        # decoded, maybe inflated.
        sent = (await execution.sized(len(cmd.body), messages_of, core, h, cmd.body, born_host)
                if h.batch else messages_of(core, h, cmd.body, born_host))
        put: Callable[[], SendResult]
        if isinstance(sent[0], PlainMessage):  # the common case: nothing to route
            plain = cast("list[PlainMessage]", sent)
            wait = any([m.wait for m in plain])

            def put() -> SendResult:
                return core.put_plain(h.topic, plain, queue_id=h.queue_id,
                                      born_timestamp=h.born_timestamp, born_host=born_host,
                                      reconsume_times=h.reconsume_times,
                                      default_topic=h.default_topic,
                                      default_topic_queue_nums=h.default_topic_queue_nums)
        else:
            messages = cast("list[Message]", sent)
            # Read before the broker routes (and strips) WAIT.
            wait = any([waits_for_store(m.properties) for m in messages])

            def put() -> SendResult:
                return core.put(messages, default_topic=h.default_topic,
                                default_topic_queue_nums=h.default_topic_queue_nums,
                                max_reconsume_times=h.max_reconsume_times)

        if core.put_writes_metadata(h.topic):  # creating a topic or group
            result = await ctx.blocking(put)  # waits on disk: keep it off the loop
            ctx.topics_changed()
        else:
            result = put()
        if ctx.durable is not None or ctx.replicated is not None:  # else no coroutine to make
            result = await replicated(ctx, await durable(ctx, result), wait)
        if result.ok:
            ctx.stats.messages_put += len(result.appended)
            ctx.stats.bytes_put += sum([a.size for a in result.appended])
        else:
            ctx.stats.puts_refused += 1
        if not result.appended or result.appended[0].physical_offset < 0:
            return cmd.response(result.code, ctx.core.refusal_remark(result.status))
        return cmd.response(result.code, None, {  # strings already: no coercion per field
            "msgId": result.msg_id, "queueId": str(result.queue_id),
            "queueOffset": str(result.queue_offset), "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        })

    return {RequestCode.SEND_MESSAGE: send, RequestCode.SEND_MESSAGE_V2: send,
            RequestCode.SEND_BATCH_MESSAGE: send}
