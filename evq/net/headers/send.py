"""The answer to SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320):
``SendMessageResponseHeader`` and the two fields RocketMQ's broker adds beside it.

The request's header is :mod:`evq.net.send_header`: it comes under long or one-letter names
and is parsed in C on the hot path, which a declaration here does not express.
"""

from __future__ import annotations

from evq.net.headers import INT, LONG, Header, header, wire


@header
class SendResponse(Header):
    msg_id: str = wire("msgId", default="")
    """The stored message's offset msgId (comma-joined for a batch)."""
    queue_id: int | None = wire("queueId", INT, default=None)
    """The queue it was stored in; a producer reading an answer without one takes the queue
    it sent to."""
    queue_offset: int = wire("queueOffset", LONG, default=-1)
    transaction_id: str | None = wire("transactionId", default=None)
    region: str = wire("MSG_REGION", default="DefaultRegion")
    trace_on: str = wire("TRACE_ON", default="true")
    """Whether the broker traces messages: Java's producer reads the text, ``"false"``
    turning its trace hook off."""
