"""Consumer offsets and a queue's bounds: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET
(15), SEARCH_OFFSET_BY_TIMESTAMP (29), GET_MAX_OFFSET (30), GET_MIN_OFFSET (31) and
GET_EARLIEST_MSG_STORETIME (32).

RocketMQ gives each of these requests and answers its own header class, several with the same
fields; a shape is declared here once, and the other Java names are aliases of it, so that each
call site still names the request it makes.
"""

from __future__ import annotations

from evq.net.headers import BOOL, INT, LONG, Header, header, wire


@header
class QueryConsumerOffsetRequest(Header):
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")
    queue_id: int = wire("queueId", INT)


@header
class QueryConsumerOffsetResponse(Header):
    """Also the answer of GET_MAX_OFFSET, GET_MIN_OFFSET and SEARCH_OFFSET_BY_TIMESTAMP."""

    offset: int = wire("offset", LONG)


@header
class UpdateConsumerOffsetRequest(Header):
    consumer_group: str = wire("consumerGroup")
    topic: str = wire("topic")
    queue_id: int = wire("queueId", INT)
    commit_offset: int = wire("commitOffset", LONG)
    take_if_newer: bool | None = wire("evqTakeIfNewer", BOOL, default=None)
    """evq's extension, sent only by a slave to its returned master: keep the offset only where
    it is ahead of the master's own.  RocketMQ clients never send it (None: left off the wire),
    and it means the same as false."""


@header
class GetMaxOffsetRequest(Header):
    """Also GET_MIN_OFFSET's and GET_EARLIEST_MSG_STORETIME's request: a queue."""

    topic: str = wire("topic")
    queue_id: int = wire("queueId", INT)


@header
class SearchOffsetRequest(Header):
    topic: str = wire("topic")
    queue_id: int = wire("queueId", INT)
    timestamp: int = wire("timestamp", LONG)
    """Milliseconds since the epoch: the first message stored at or after it is found."""


@header
class GetEarliestMsgStoretimeResponse(Header):
    timestamp: int = wire("timestamp", LONG)


GetMinOffsetRequest = GetMaxOffsetRequest
GetEarliestMsgStoretimeRequest = GetMaxOffsetRequest
GetMaxOffsetResponse = QueryConsumerOffsetResponse
GetMinOffsetResponse = QueryConsumerOffsetResponse
SearchOffsetResponse = QueryConsumerOffsetResponse
