"""Offsets and messages by position, time, key or id (codes 12, 29-33)."""

from __future__ import annotations

from evq.domain.codes import BrokerError, ResponseCode
from evq.net.broker.context import BrokerContext
from evq.net.codes import RequestCode
from evq.net.headers.offsets import (
    GetEarliestMsgStoretimeRequest,
    GetEarliestMsgStoretimeResponse,
    GetMaxOffsetRequest,
    GetMaxOffsetResponse,
    GetMinOffsetRequest,
    GetMinOffsetResponse,
    SearchOffsetRequest,
    SearchOffsetResponse,
)
from evq.net.headers.queries import (
    DEFAULT_QUERY_MAX,
    QueryMessageRequest,
    QueryMessageResponse,
    ViewMessageRequest,
)
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    log = ctx.core.log

    async def max_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetMaxOffsetRequest.read(cmd.ext_fields)
        return cmd.response(fields=GetMaxOffsetResponse.write(
            offset=log.bounds(h.topic, h.queue_id)[1]))

    async def min_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetMinOffsetRequest.read(cmd.ext_fields)
        return cmd.response(fields=GetMinOffsetResponse.write(
            offset=log.bounds(h.topic, h.queue_id)[0]))

    async def by_timestamp(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = SearchOffsetRequest.read(cmd.ext_fields)
        return cmd.response(fields=SearchOffsetResponse.write(
            offset=log.offset_for_time(h.topic, h.queue_id, h.timestamp)))

    async def earliest_time(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = GetEarliestMsgStoretimeRequest.read(cmd.ext_fields)
        lo, _hi = log.bounds(h.topic, h.queue_id)
        return cmd.response(fields=GetEarliestMsgStoretimeResponse.write(
            timestamp=log.store_time_at(h.topic, h.queue_id, lo)))

    async def view_by_id(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        offset = ViewMessageRequest.read(cmd.ext_fields).offset
        view = log.lookup(offset)
        if view is None:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"can not find message by the offset, {offset}")
        return cmd.response(body=bytes(view))

    async def query_message(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryMessageRequest.read(cmd.ext_fields)
        max_num = DEFAULT_QUERY_MAX if h.unique_key_query else h.max_num
        r = log.query_keys(h.topic, h.key, max_num, h.begin_timestamp, h.end_timestamp)
        if not r.records:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                              "can not find message, maybe time range not correct")
        return cmd.response(fields=QueryMessageResponse.write(
            index_last_update_timestamp=r.index_last_update_timestamp,
            index_last_update_phyoffset=r.index_last_update_physical_offset,
        ), body=b"".join(r.records))

    return {
        RequestCode.GET_MAX_OFFSET: max_offset,
        RequestCode.GET_MIN_OFFSET: min_offset,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: by_timestamp,
        RequestCode.GET_EARLIEST_MSG_STORETIME: earliest_time,
        RequestCode.VIEW_MESSAGE_BY_ID: view_by_id,
        RequestCode.QUERY_MESSAGE: query_message,
    }
