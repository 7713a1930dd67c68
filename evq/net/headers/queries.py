"""Messages by id or key: VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12)."""

from __future__ import annotations

from typing import Final

from evq.acl.signature import UNIQUE_KEY_QUERY
from evq.net.headers import BOOL, INT, LONG, Header, header, wire
from evq.net.protocol import INT64_MAX

DEFAULT_QUERY_MAX: Final = 32
"""RocketMQ's ``defaultQueryMaxNum``: the most messages a unique-key query, or a key query
that names no ``maxNum``, answers."""


@header
class ViewMessageRequest(Header):
    offset: int = wire("offset", LONG)
    """The message's commit-log offset (the second half of an offset msgId)."""


@header
class QueryMessageRequest(Header):
    topic: str = wire("topic")
    key: str = wire("key")
    max_num: int = wire("maxNum", INT, default=DEFAULT_QUERY_MAX)
    begin_timestamp: int = wire("beginTimestamp", LONG, default=0)
    end_timestamp: int = wire("endTimestamp", LONG, default=INT64_MAX)
    unique_key_query: bool = wire(UNIQUE_KEY_QUERY, BOOL, default=False)
    """``key`` is a UNIQ_KEY (client msgId), not a KEYS entry: ``max_num`` is not read.  Not a
    field of Java's header but an extField its client adds (``MixAll.UNIQUE_MSG_QUERY_FLAG``),
    left out of the signature (:mod:`evq.acl.signature`)."""


@header
class QueryMessageResponse(Header):
    index_last_update_timestamp: int = wire("indexLastUpdateTimestamp", LONG)
    index_last_update_phyoffset: int = wire("indexLastUpdatePhyoffset", LONG)
