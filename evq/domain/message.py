"""The message model and RocketMQ's properties string.

A :class:`Message` holds every field of the stored record (see :mod:`evq.domain.record`); the
fields a producer sets (topic, body, flag, properties) come first, the ones the broker owns
(queue and physical offsets, store time and host) after them with neutral defaults.  Tags and
keys live in the properties under RocketMQ's literal names, so a message read back from the log
equals the one written.
"""

from __future__ import annotations

import ipaddress
import os
import zlib
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Protocol

import attrs

from evq.domain import sysflag as sf

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "
MAX_PROPERTIES_BYTES = 32767
COMPRESS_OVER = 4096


class Prop:
    """Literal property names clients and brokers agree on (RocketMQ ``MessageConst``)."""

    TAGS = "TAGS"
    KEYS = "KEYS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    UNIQ_KEY = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    CLUSTER = "CLUSTER"
    START_DELIVER_TIME = "__STARTDELIVERTIME"
    SHARDING_KEY = "__SHARDINGKEY"
    TRANSACTION_ID = "__transactionId__"


Host = tuple[str, int]
"""An ``(ip, port)`` pair; IPv4 unless the matching sysflag bit says IPv6."""

NO_HOST: Host = ("0.0.0.0", 0)


class PropertyError(ValueError):
    """A property name or value that the properties string cannot carry."""


def encode_properties(props: Mapping[str, str]) -> str:
    """``name\x01value\x02`` per entry, trailing separator kept as the C++ and JS clients do."""
    if len(props) == 1:  # a single send's UNIQ_KEY alone: checked without joining and counting
        ((name, value),) = props.items()
        if name and not _has_separator(name) and not _has_separator(value):
            return name + NAME_VALUE_SEPARATOR + value + PROPERTY_SEPARATOR
    elif not props:
        return ""
    # Joined in C, then checked whole: each entry adds exactly one of each separator, so any
    # other count means a name or value holds one, which the search below then names.
    text = PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, props.items()))
    n = len(props)
    if (text.count(NAME_VALUE_SEPARATOR) == n and text.count(PROPERTY_SEPARATOR) == n - 1
            and "" not in props):
        return text + PROPERTY_SEPARATOR
    bad = next(name for name, value in props.items()
               if not name or _has_separator(name) or _has_separator(value))
    raise PropertyError(f"property {bad!r} contains a separator or is empty")


def _has_separator(s: str) -> bool:
    return NAME_VALUE_SEPARATOR in s or PROPERTY_SEPARATOR in s


def decode_properties(text: str) -> dict[str, str]:
    """Parse a properties string from any producer (Java omits the last separator)."""
    props: dict[str, str] = {}
    for piece in text.split(PROPERTY_SEPARATOR):
        name, sep, value = piece.partition(NAME_VALUE_SEPARATOR)
        if sep and name:
            props[name] = value
    return props


def split_keys(keys: str | None) -> list[str]:
    """The KEYS property holds several keys separated by spaces; each is indexed."""
    return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []


def waits_for_store(props: Mapping[str, str]) -> bool:
    """RocketMQ's ``isWaitStoreMsgOK``: unless a producer set ``WAIT=false``, it wants its
    answer only once a SYNC_MASTER's slave holds the message."""
    return props.get(Prop.WAIT, "true").lower() != "false"


@lru_cache(maxsize=1024)
def host_bytes(host: Host) -> bytes:
    """Address bytes plus a 4-byte big-endian port, as the record and msgIds store a host."""
    ip, port = host
    return ipaddress.ip_address(ip).packed + port.to_bytes(4, "big")


@lru_cache(maxsize=1024)
def is_ipv6(host: Host) -> bool:
    return ipaddress.ip_address(host[0]).version == 6


@attrs.define(slots=True, eq=True)
class Message:
    """One message with every stored-record field.

    ``body`` holds the stored bytes: compressed when ``sysflag`` has the COMPRESSED bit (the
    producer compresses, the broker never touches bodies); :meth:`payload` inflates.
    """

    topic: str
    body: bytes = b""
    flag: int = 0
    properties: dict[str, str] = attrs.field(factory=dict)
    queue_id: int = 0
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: Host = NO_HOST
    store_timestamp: int = 0
    store_host: Host = NO_HOST
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    body_crc: int = attrs.field(default=0, eq=False)  # derived from body; set by decode

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(Prop.KEYS))

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)

    def index_keys(self) -> tuple[str, ...]:
        """Keys the IndexFile records for this message: UNIQ_KEY first, then every KEYS word."""
        uniq = self.uniq_key
        words = self.keys
        return (uniq, *words) if uniq else tuple(words)

    def payload(self) -> bytes:
        """The body as the producer gave it (inflated if it was stored compressed)."""
        return zlib.decompress(self.body) if self.sysflag & sf.COMPRESSED else self.body


def _new_message(
    topic: str,
    body: bytes,
    *,
    tags: str | None = None,
    keys: Iterable[str] | str | None = None,
    properties: Mapping[str, str] | None = None,
    flag: int = 0,
    compress_over: int | None = COMPRESS_OVER,
) -> Message:
    """A producer-side message: tags/keys folded into properties, large bodies compressed.
    Pure: the reference of the compiled twin (evq/domain/message_kernels.pyx)."""
    props = dict(properties) if properties else {}
    if tags:
        props[Prop.TAGS] = tags
    if keys:
        props[Prop.KEYS] = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
    sysflag = 0
    if compress_over is not None and len(body) >= compress_over:
        body = zlib.compress(body, 5)
        sysflag |= sf.COMPRESSED
    # Positional (topic, body, flag, properties, queue_id, sysflag): a producer makes one
    # per send, and the generated __init__ matches keywords at a quarter of its cost.
    return Message(topic, body, flag, props, 0, sysflag)


# --- the compiled kernel -------------------------------------------------------------------

PURE_PYTHON_VARIABLE = "EVQ_PURE_PYTHON"
"""Set (to anything but 0) to run pure Python even where the compiled kernels are built: every
module with kernels (this one, :mod:`evq.domain.record`, :mod:`evq.net.protocol`, ...) reads
it as it loads."""

class NewMessage(Protocol):
    """:func:`_new_message`'s signature, which its compiled twin shares."""

    def __call__(self, topic: str, body: bytes, *, tags: str | None = None,
                 keys: Iterable[str] | str | None = None,
                 properties: Mapping[str, str] | None = None, flag: int = 0,
                 compress_over: int | None = COMPRESS_OVER) -> Message: ...


PURE_NEW_MESSAGE: NewMessage = _new_message


def _compiled_new_message() -> NewMessage | None:
    """The compiled ``new_message``, bound to :class:`Message`; None where it was not built or
    :data:`PURE_PYTHON_VARIABLE` asks for pure Python."""
    if os.environ.get(PURE_PYTHON_VARIABLE, "0") not in ("", "0"):
        return None
    try:
        from evq.domain import message_kernels
    except ImportError:
        return None
    message_kernels.bind(message=Message, tags=Prop.TAGS, keys=Prop.KEYS,
                         separator=KEY_SEPARATOR, compressed=sf.COMPRESSED,
                         compress_over=COMPRESS_OVER)
    compiled: NewMessage = message_kernels.new_message
    return compiled


COMPILED_NEW_MESSAGE = _compiled_new_message()
"""The compiled ``new_message``, or None where it is not built or not wanted."""
new_message: NewMessage = COMPILED_NEW_MESSAGE or PURE_NEW_MESSAGE
"""A producer-side message (see :func:`_new_message`): the compiled twin where it is built."""
