"""Offsets and messages by position, time, key or id (codes 12, 29-33)."""

from __future__ import annotations

from evq.domain.codes import BrokerError, ResponseCode
from evq.net.broker.context import BrokerContext
from evq.net.codes import RequestCode
from evq.net.protocol import RemotingCommand
from evq.net.transport import Connection, Handler

DEFAULT_QUERY_MAX = 32  # defaultQueryMaxNum


def handlers(ctx: BrokerContext) -> dict[int, Handler]:
    log = ctx.core.log

    def queue(cmd: RemotingCommand) -> tuple[str, int]:
        return cmd.get_str("topic"), cmd.get_int("queueId")

    async def max_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(fields={"offset": log.bounds(*queue(cmd))[1]})

    async def min_offset(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(fields={"offset": log.bounds(*queue(cmd))[0]})

    async def by_timestamp(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic, qid = queue(cmd)
        return cmd.response(fields={
            "offset": log.offset_for_time(topic, qid, cmd.get_long("timestamp"))})

    async def earliest_time(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic, qid = queue(cmd)
        lo, _hi = log.bounds(topic, qid)
        return cmd.response(fields={"timestamp": log.store_time_at(topic, qid, lo)})

    async def view_by_id(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        offset = cmd.get_long("offset")
        view = log.lookup(offset)
        if view is None:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"can not find message by the offset, {offset}")
        return cmd.response(body=bytes(view))

    async def query_message(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        unique = cmd.get_bool("_UNIQUE_KEY_QUERY", False)
        max_num = DEFAULT_QUERY_MAX if unique else cmd.get_int("maxNum", DEFAULT_QUERY_MAX)
        r = log.query_keys(cmd.get_str("topic"), cmd.get_str("key"), max_num,
                           cmd.get_long("beginTimestamp", 0),
                           cmd.get_long("endTimestamp", 2**63 - 1))
        if not r.records:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                              "can not find message, maybe time range not correct")
        return cmd.response(fields={
            "indexLastUpdateTimestamp": r.index_last_update_timestamp,
            "indexLastUpdatePhyoffset": r.index_last_update_physical_offset,
        }, body=b"".join(r.records))

    return {
        RequestCode.GET_MAX_OFFSET: max_offset,
        RequestCode.GET_MIN_OFFSET: min_offset,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: by_timestamp,
        RequestCode.GET_EARLIEST_MSG_STORETIME: earliest_time,
        RequestCode.VIEW_MESSAGE_BY_ID: view_by_id,
        RequestCode.QUERY_MESSAGE: query_message,
    }
