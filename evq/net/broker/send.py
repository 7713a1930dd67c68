"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320)."""

from __future__ import annotations

import zlib
from typing import Final

from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.broker import SendResult
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.compression import InflateError, inflate
from evq.domain.log import PutStatus
from evq.domain.message import COMPRESS_OVER, Message, Prop, decode_properties
from evq.domain.record import RecordError, decode_batch
from evq.net import execution, send_header
from evq.net.broker.context import BrokerContext, parse_host
from evq.net.codes import RequestCode
from evq.net.protocol import MAX_FRAME, RemotingCommand
from evq.net.send_header import SendHeader
from evq.net.transport import Connection, Handler

MAX_INFLATED_BATCH: Final = MAX_FRAME
"""A compressed batch may inflate to what an uncompressed request could carry, no more: a
1 MiB zlib bomb once asked for 2 GiB."""


def messages_of(conn: Connection, h: SendHeader, body: bytes) -> list[Message]:
    """The request's messages; a batch is decoded (and inflated) here, so this runs off the
    loop for large bodies (see :func:`evq.net.execution.sized`)."""
    topic, queue_id, sysflag, born_ts = h.topic, h.queue_id, h.sys_flag, h.born_timestamp
    reconsume = h.reconsume_times
    born_host = parse_host(conn.peer)
    if h.batch:
        if len(topic) > tp.MAX_TOPIC_LENGTH:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "topic of a batch is too long")
        try:
            if sysflag & sf.COMPRESSED:  # the C++ client deflates a whole batch over 4 KiB
                body = inflate(body, MAX_INFLATED_BATCH)
            entries = decode_batch(body)
        except (RecordError, InflateError) as exc:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
        if not entries:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "a batch without messages")
        # Each stored record carries its own compression flag, as a single send would.
        return [Message(topic=topic, body=zlib.compress(e.body, 5) if big else e.body,
                        flag=e.flag, properties=e.properties, queue_id=queue_id,
                        sysflag=(sysflag & ~sf.COMPRESSED) | (sf.COMPRESSED if big else 0),
                        born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume)
                for e in entries for big in (len(e.body) >= COMPRESS_OVER,)]
    return [Message(topic=topic, body=body, flag=h.flag,
                    properties=decode_properties(h.properties), queue_id=queue_id,
                    sysflag=sysflag, born_timestamp=born_ts, born_host=born_host,
                    reconsume_times=reconsume)]


async def durable(ctx: BrokerContext, result: SendResult) -> SendResult:
    """Wait for the flush policy without blocking the loop (group commit, one flusher request
    a round).  Under ASYNC_FLUSH there is nothing to wait for, and no thread hop is paid."""
    if not result.ok or ctx.durable is None:
        return result
    if await ctx.durable.wait(result.end_offset):
        return result
    return SendResult(PutStatus.FLUSH_DISK_TIMEOUT, result.topic, result.queue_id,
                      result.appended)


def waits_for_store(messages: list[Message]) -> bool:
    """RocketMQ's ``isWaitStoreMsgOK``: a producer that set ``WAIT=false`` on every message
    wants its answer before the slave has them."""
    return any(m.properties.get(Prop.WAIT, "true").lower() != "false" for m in messages)


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
        # A single message's body is taken as it is; a batch's is decoded, maybe inflated.
        work = len(cmd.body) if h.batch else 0
        messages = await execution.sized(work, messages_of, conn, h, cmd.body)
        wait = waits_for_store(messages)  # read before the broker routes (and strips) WAIT

        def put() -> SendResult:
            return ctx.core.put(messages, default_topic=h.default_topic,
                                default_topic_queue_nums=h.default_topic_queue_nums,
                                max_reconsume_times=h.max_reconsume_times)

        if ctx.core.put_writes_metadata(messages[0].topic):  # creating a topic or group
            result = await ctx.blocking(put)  # waits on disk: keep it off the loop
            ctx.topics_changed()
        else:
            result = put()
        result = await replicated(ctx, await durable(ctx, result), wait)
        if result.ok:
            ctx.stats.messages_put += len(result.appended)
            ctx.stats.bytes_put += sum(a.size for a in result.appended)
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
