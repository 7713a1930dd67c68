"""Client-facing group traffic: heartbeats, group membership, offsets, send-back, locks and
END_TRANSACTION; and the broker-to-client notifications they cause."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from evq import logs
from evq.domain import sysflag as sf
from evq.domain import topics as tp
from evq.domain.codes import BrokerError, ResponseCode
from evq.domain.filters import FilterError, parse_subscription
from evq.domain.groups import validate_group
from evq.domain.membership import ConsumerData, Heartbeat
from evq.domain.queues import MessageQueue
from evq.domain.retry import send_back
from evq.net.broker.context import BrokerContext
from evq.net.codes import RequestCode, Version
from evq.net.fastjson import queue_json
from evq.net.headers.clients import (
    ConsumerSendMsgBackRequest,
    GetConsumerListByGroupRequest,
    NotifyConsumerIdsChangedRequest,
    UnregisterClientRequest,
)
from evq.net.headers.offsets import (
    QueryConsumerOffsetRequest,
    QueryConsumerOffsetResponse,
    UpdateConsumerOffsetRequest,
)
from evq.net.headers.transactions import EndTransactionRequest
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler

log = logs.get_logger(__name__)

# The C++ client sends these enums as ordinals.
CONSUME_TYPES = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY"}
MESSAGE_MODELS = {0: "BROADCASTING", 1: "CLUSTERING"}
CONSUME_FROM = {0: "CONSUME_FROM_LAST_OFFSET",
                1: "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                2: "CONSUME_FROM_MIN_OFFSET", 3: "CONSUME_FROM_MAX_OFFSET",
                4: "CONSUME_FROM_FIRST_OFFSET", 5: "CONSUME_FROM_TIMESTAMP"}


def _enum(value: object, names: Mapping[int, str]) -> str:
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return names.get(int(value), str(value))
    return str(value)


# What reading a JSON body of the wrong shape raises: a number where a list was expected, a
# missing key, a queue id of "x" or 1e400.
BAD_SHAPE = (AttributeError, KeyError, TypeError, ValueError, OverflowError)


def json_body(cmd: RemotingCommand) -> dict[str, object]:
    try:
        body = json.loads(cmd.body) if cmd.body else {}
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"the request body is not JSON: {exc}"
                          ) from None
    if not isinstance(body, dict):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, "the request body is not a JSON object")
    return body


def _bad_body(what: str, exc: Exception) -> BrokerError:
    return BrokerError(ResponseCode.SYSTEM_ERROR, f"bad {what}: {type(exc).__name__}: {exc}")


def parse_heartbeat(body: Mapping[str, object]) -> Heartbeat:
    """The HeartbeatData body; refused whole when it has no client id (before any group it
    names is created) or a part of the wrong shape."""
    client_id = str(body.get("clientID") or "")
    if not client_id:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, "heartbeat without a client id")
    try:
        consumers = [_consumer_data(c) for c in body.get("consumerDataSet") or []]  # type: ignore[attr-defined]
        producers = [str(p["groupName"]) for p in body.get("producerDataSet") or []]  # type: ignore[attr-defined]
    except BAD_SHAPE as exc:
        raise _bad_body("heartbeat", exc) from None
    for group in [c.group for c in consumers] + producers:
        validate_group(group)
    return Heartbeat(client_id, consumers, producers)


def _consumer_data(c: Mapping[str, object]) -> ConsumerData:
    group = str(c["groupName"])
    subs = {}
    for s in c.get("subscriptionDataSet") or []:  # type: ignore[attr-defined]
        topic = str(s["topic"])
        try:
            subs[topic] = parse_subscription(
                topic, s.get("subString"), s.get("expressionType") or "TAG",
                int(s.get("subVersion") or 0))
        except (FilterError, ValueError) as exc:
            log.warning("bad_subscription_in_heartbeat", group=group, topic=topic,
                        error=str(exc))
    return ConsumerData(
        group, _enum(c.get("consumeType"), CONSUME_TYPES),
        _enum(c.get("messageModel"), MESSAGE_MODELS),
        _enum(c.get("consumeFromWhere"), CONSUME_FROM), subs)


def body_group(body: Mapping[str, object]) -> str:
    """The ``consumerGroup`` of a queue-lock body, checked as a header's would be."""
    group = str(body.get("consumerGroup"))
    validate_group(group)
    return group


def queues_of(items: Iterable[Mapping[str, object]]) -> list[MessageQueue]:
    try:
        return [MessageQueue(str(q["topic"]), str(q["brokerName"]), int(q["queueId"]))  # type: ignore[call-overload]
                for q in items]
    except BAD_SHAPE as exc:
        raise _bad_body("message queue set", exc) from None


def notify_ids_changed(ctx: BrokerContext, groups: Iterable[str]) -> None:
    """NOTIFY_CONSUMER_IDS_CHANGED to every remaining member of each group (oneway)."""
    for group in groups:
        config = ctx.core.group(group)
        if config is not None and not config.notify_consumer_ids_changed_enable:
            continue
        info = ctx.membership.consumer_group(group)
        for member in info.members if info else ():
            conn = member.connection
            if isinstance(conn, Connection) and not conn.is_closed:
                conn.send_oneway(RemotingCommand.request(
                    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                    NotifyConsumerIdsChangedRequest.write(consumer_group=group),
                    oneway=True))


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    async def heart_beat(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        beat = parse_heartbeat(json_body(cmd))
        for c in beat.consumers:
            group = await ctx.blocking(ctx.core.ensure_group, c.group)
            retry = tp.retry_topic(c.group)
            # A slave has its master's retry topics through the log and creates none itself.
            if (group.retry_queue_nums > 0 and ctx.core.topic(retry) is None
                    and not ctx.core.config.is_slave):
                await ctx.blocking(ctx.core.ensure_topic, retry, group.retry_queue_nums)
                ctx.topics_changed()
        if conn not in ctx.clients:
            conn.add_close_callback(lambda c: notify_ids_changed(
                ctx, ctx.membership.connection_closed(c)))
        ctx.clients[conn] = (cmd.language, cmd.version)
        notify_ids_changed(ctx, ctx.membership.heartbeat(conn, beat))
        return cmd.response()

    async def unregister(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = UnregisterClientRequest.read(cmd.ext_fields)
        changed = ctx.membership.unregister(conn, consumer_group=h.consumer_group,
                                            producer_group=h.producer_group)
        notify_ids_changed(ctx, changed)
        return cmd.response()

    async def consumer_list(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = GetConsumerListByGroupRequest.read(cmd.ext_fields).consumer_group
        ids = ctx.membership.client_ids(group)
        if not ids:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(body=json.dumps({"consumerIdList": ids}).encode())

    async def query_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryConsumerOffsetRequest.read(cmd.ext_fields)
        group, topic, qid = h.consumer_group, h.topic, h.queue_id
        offset = ctx.core.query_offset(group, topic, qid)
        if offset < 0:
            lo, _hi = ctx.core.log.bounds(topic, qid)
            if lo > 0:  # Java: only a queue still starting at 0 answers "from 0"
                raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                                  "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
            offset = 0
        return cmd.response(fields=QueryConsumerOffsetResponse.write(offset=offset))

    async def update_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = UpdateConsumerOffsetRequest.read(cmd.ext_fields)
        key = (h.consumer_group, h.topic, h.queue_id)
        if h.take_if_newer:  # a slave handing back what it kept
            ctx.core.take_newer_offsets({key: h.commit_offset})
        else:
            ctx.core.commit_offset(*key, h.commit_offset)
        return cmd.response()

    async def send_msg_back(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = ConsumerSendMsgBackRequest.read(cmd.ext_fields)
        max_times = h.max_reconsume_times if cmd.version >= Version.V3_4_9 else None
        result = await ctx.blocking(lambda: send_back(
            ctx.core, h.group, h.offset, delay_level=h.delay_level,
            max_reconsume_times=max_times))
        if not result.ok:  # the consumer then retries the message itself: it must not be lost
            return cmd.response(result.code, ctx.core.refusal_remark(result.status))
        return cmd.response()

    async def lock_batch(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = json_body(cmd)
        locked = ctx.core.locks.lock_batch(body_group(body),
                                           queues_of(body.get("mqSet") or []),  # type: ignore[arg-type]
                                           str(body.get("clientId")))
        return cmd.response(body=json.dumps(
            {"lockOKMQSet": [queue_json(q) for q in sorted(locked)]}).encode())

    async def unlock_batch(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        body = json_body(cmd)
        ctx.core.locks.unlock_batch(body_group(body),
                                    queues_of(body.get("mqSet") or []),  # type: ignore[arg-type]
                                    str(body.get("clientId")))
        return cmd.response()

    async def end_transaction(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        h = EndTransactionRequest.read(cmd.ext_fields)
        commit = {sf.TRANSACTION_COMMIT_TYPE: True,
                  sf.TRANSACTION_ROLLBACK_TYPE: False}.get(h.commit_or_rollback)
        if commit is None:
            return None  # state unknown: Java sends no answer and waits for the check
        result = await ctx.blocking(
            ctx.engine.transactions.end, h.producer_group, h.tran_state_table_offset,
            h.commit_log_offset, commit)
        if result is not None and not result.ok:
            return cmd.response(result.code, ctx.core.refusal_remark(result.status))
        return cmd.response()

    return {
        RequestCode.HEART_BEAT: heart_beat,
        RequestCode.UNREGISTER_CLIENT: unregister,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
        RequestCode.QUERY_CONSUMER_OFFSET: query_offset,
        RequestCode.UPDATE_CONSUMER_OFFSET: update_offset,
        RequestCode.CONSUMER_SEND_MSG_BACK: send_msg_back,
        RequestCode.LOCK_BATCH_MQ: lock_batch,
        RequestCode.UNLOCK_BATCH_MQ: unlock_batch,
        RequestCode.END_TRANSACTION: end_transaction,
    }
