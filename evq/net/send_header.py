"""The send request header (SendMessageRequestHeader and its V2 twin), parsed once.

SEND_MESSAGE carries the header under its long field names; SEND_MESSAGE_V2 under one-letter
names (``a`` for producerGroup, ``b`` for topic, ...), to save bytes on every message; batches
and replies carry either.  :func:`parse` reads whichever it is straight into a typed
:class:`SendHeader`, with a refusal that names the long field, as Java's header decoding
does.  It is kept apart from the send processor because the ACL verifier and the group-name
check must read a send's topic and group exactly as the processor will: a request carrying
both ``topic`` and ``b`` is checked against the topic it is stored under, never the other one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

import attrs

from evq.domain import topics as tp
from evq.net import protocol
from evq.net.codes import RequestCode
from evq.net.protocol import (
    HeaderFieldError,
    parse_bool_field,
    parse_int_field,
    parse_long_field,
)

# SendMessageRequestHeaderV2's one-letter names, in RocketMQ's order.
V2_NAMES: Final = dict(zip("abcdefghijklmn", (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
    "batch", "bname"), strict=True))
_SHORT: Final = {long: short for short, long in V2_NAMES.items()}

MAX_RECONSUME_SINCE: Final = 121
"""The request version (V3_4_9) from which Java's broker reads ``maxReconsumeTimes``."""


def is_v2(code: int, fields: Mapping[str, str]) -> bool:
    """Whether a send's header uses V2's names: SEND_MESSAGE_V2 always; batches and replies
    carry either header, and V2's when ``b`` (the topic) is there."""
    return code == RequestCode.SEND_MESSAGE_V2 or "b" in fields


def field(code: int, fields: Mapping[str, str], name: str) -> str | None:
    """The send header's field ``name`` (its long name) under whichever naming it came."""
    return fields.get(_SHORT[name] if is_v2(code, fields) else name)


@attrs.define(slots=True)
class SendHeader:
    """What the send processor reads of a send header, typed; absent optional fields are
    what RocketMQ's broker takes for them.  Not frozen: one is parsed per send, and a frozen
    class's constructor sets its eleven fields through ``object.__setattr__``; nothing
    changes one once parsed."""

    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp: int
    default_topic: str = tp.AUTO_CREATE_TOPIC
    default_topic_queue_nums: int = 4
    flag: int = 0
    properties: str = ""
    reconsume_times: int = 0
    max_reconsume_times: int | None = None
    """Only from request version 121 (V3_4_9) on, as Java reads it; None otherwise."""
    batch: bool = False


def parse(code: int, version: int, fields: Mapping[str, str]) -> SendHeader:
    """``fields`` (a send's ``ext_fields``) as a :class:`SendHeader`; a required field that
    is absent, or any field that does not parse, is a :class:`HeaderFieldError`.

    The reference; where the frame kernels are built, ``parse`` is their compiled twin
    (``parse_send_header`` in evq/net/frame_kernels.pyx), which reads the usual header (short
    ASCII numbers, the batch flag as Java spells it) in C and hands anything else to this."""
    if is_v2(code, fields):
        topic, default_topic, default_queues, queue_id, sys_flag, born, flag, props, \
            reconsume, max_reconsume, batch = map(fields.get, "bcdefghijlm")
    else:
        get = fields.get
        topic, default_topic, default_queues = (
            get("topic"), get("defaultTopic"), get("defaultTopicQueueNums"))
        queue_id, sys_flag, born, flag, props = (
            get("queueId"), get("sysFlag"), get("bornTimestamp"), get("flag"), get("properties"))
        reconsume, max_reconsume, batch = (
            get("reconsumeTimes"), get("maxReconsumeTimes"), get("batch"))
    return SendHeader(
        topic=_required("topic", topic),
        queue_id=parse_int_field("queueId", _required("queueId", queue_id)),
        sys_flag=parse_int_field("sysFlag", _required("sysFlag", sys_flag)),
        born_timestamp=parse_long_field("bornTimestamp", _required("bornTimestamp", born)),
        default_topic=tp.AUTO_CREATE_TOPIC if default_topic is None else default_topic,
        default_topic_queue_nums=(4 if default_queues is None
                                  else parse_int_field("defaultTopicQueueNums", default_queues)),
        flag=0 if flag is None else parse_int_field("flag", flag),
        properties=props or "",
        reconsume_times=0 if reconsume is None else parse_int_field("reconsumeTimes", reconsume),
        max_reconsume_times=(parse_int_field("maxReconsumeTimes", max_reconsume)
                             if max_reconsume is not None and version >= MAX_RECONSUME_SINCE
                             else None),
        batch=(code == RequestCode.SEND_BATCH_MESSAGE
               or (batch is not None and parse_bool_field("batch", batch))),
    )


def _required(name: str, value: str | None) -> str:
    if value is None:
        raise HeaderFieldError(f"the custom field <{name}> is null")
    return value


Parse = Callable[[int, int, Mapping[str, str]], SendHeader]


def _compiled_parse() -> Parse | None:
    """The compiled twin of :func:`parse`, bound to this module; None where the frame kernels
    are not built or not wanted (the same switch as :data:`evq.net.protocol.COMPILED`)."""
    if protocol.COMPILED is None:
        return None
    from evq.net import frame_kernels

    frame_kernels.bind_send_header(
        send_header=SendHeader, pure_parse=parse, short_names=_SHORT,
        auto_create=tp.AUTO_CREATE_TOPIC, v2_code=RequestCode.SEND_MESSAGE_V2,
        batch_code=RequestCode.SEND_BATCH_MESSAGE, reconsume_since=MAX_RECONSUME_SINCE)
    return frame_kernels.parse_send_header  # type: ignore[no-any-return]


PURE_PARSE: Final[Parse] = parse
COMPILED_PARSE: Final = _compiled_parse()
"""The compiled parse, or None where it is not built or not wanted."""
parse = COMPILED_PARSE or PURE_PARSE  # type: ignore[assignment]
