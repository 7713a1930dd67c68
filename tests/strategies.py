"""Hypothesis strategies for evq's domain objects, kept in one place for every test module.

Naming: a plain noun (``topics``, ``bodies``) is a ready strategy; a function returning a
strategy is named for what it draws (``messages()``, ``hosts()``) and takes keyword options.

Everything drawn here is encodable by :func:`evq.domain.record.encode`: topics fit the 127-byte
limit, property names and values carry no separator, integers fit their stored widths, and the
whole properties string stays far below 32767 bytes.
"""

from __future__ import annotations

import zlib

from hypothesis import strategies as st

from evq.domain import sysflag as sf
from evq.domain.message import Host, Message, Prop
from evq.domain.queues import MessageQueue
from evq.domain.record import MAX_TOPIC_BYTES, PutRecord, put_record
from evq.domain.topics import TopicConfig, TopicFilterType
from evq.net.codes import LanguageCode
from evq.net.protocol import RemotingCommand, SerializeType

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "TOPIC_ALPHABET",
    "bodies",
    "client_id_lists",
    "client_ids",
    "codec_topics",
    "host_ports",
    "hosts",
    "int32s",
    "ipv4_hosts",
    "ipv6_hosts",
    "key_lists",
    "keys",
    "message_queues",
    "messages",
    "non_negative_int32s",
    "non_negative_int64s",
    "ports",
    "properties",
    "property_names",
    "property_values",
    "put_records",
    "queue_lists",
    "remoting_commands",
    "rooms",
    "sysflags",
    "tags",
    "timestamps",
    "topic_configs",
    "topics",
    "unicode_topics",
    "wide_ports",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

int32s = st.integers(INT32_MIN, INT32_MAX)
non_negative_int32s = st.integers(0, INT32_MAX)
non_negative_int64s = st.integers(0, INT64_MAX)
timestamps = non_negative_int64s
"""Milliseconds since the epoch, as the record's int64 timestamp fields hold them."""

# --- topics --------------------------------------------------------------------------------

TOPIC_ALPHABET = "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
"""RocketMQ's legal topic characters (``[%|a-zA-Z0-9_-]``)."""

topics = st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=MAX_TOPIC_BYTES)
"""Topic names a broker accepts: 1..127 characters of :data:`TOPIC_ALPHABET`."""

topic_configs = st.builds(
    TopicConfig,
    topic_name=topics,
    read_queue_nums=st.integers(0, 1024),
    write_queue_nums=st.integers(0, 1024),
    perm=st.integers(0, 15),
    order=st.booleans(),
    topic_sys_flag=st.integers(0, 3),
    topic_filter_type=st.sampled_from(TopicFilterType),
)
"""Any valid topic config (queue counts 0..1024, any perm bits)."""


def _truncate_utf8(text: str, limit: int = MAX_TOPIC_BYTES) -> str:
    """The longest prefix of ``text`` whose UTF-8 fits in ``limit`` bytes."""
    return text.encode()[:limit].decode(errors="ignore")


_UTF8_CHARS = st.characters(codec="utf-8")  # every code point but lone surrogates

unicode_topics = (
    st.text(_UTF8_CHARS, min_size=1, max_size=MAX_TOPIC_BYTES).map(_truncate_utf8).filter(bool)
)
"""Any non-empty text (no lone surrogates) whose UTF-8 is at most 127 bytes."""

codec_topics = topics | unicode_topics
"""Whatever the record codec must carry: legal names and arbitrary Unicode."""

# --- properties, tags, keys ----------------------------------------------------------------

_NO_SEPARATORS = st.characters(codec="utf-8", exclude_characters="\x01\x02")

property_names = st.text(_NO_SEPARATORS, min_size=1, max_size=24)
property_values = st.text(_NO_SEPARATORS, max_size=48)
properties = st.dictionaries(property_names, property_values, max_size=8)
"""Property maps without the ``\\x01``/``\\x02`` separators; names non-empty, values any."""

tags = st.text(_NO_SEPARATORS, min_size=1, max_size=32)
"""A TAGS value (non-empty; an empty one is no tag at all)."""

keys = st.text(
    st.characters(codec="utf-8", exclude_characters="\x01\x02 "), min_size=1, max_size=32
)
"""One message key: no separator and no space (KEYS joins several with spaces)."""

key_lists = st.lists(keys, max_size=4)

# --- bodies --------------------------------------------------------------------------------

bodies = st.binary(max_size=4096)
"""Stored bodies: any bytes, empty included, up to 4 KiB."""

# --- hosts ---------------------------------------------------------------------------------

ports = st.integers(0, 65535)
wide_ports = st.integers(0, INT32_MAX)
"""The record stores a port in 4 bytes, so anything up to 2**31-1 must survive the codec."""

host_ports = ports | wide_ports


def ipv4_hosts(port: st.SearchStrategy[int] = ports) -> st.SearchStrategy[Host]:
    """``(ip, port)`` with an IPv4 address in canonical text form."""
    return st.tuples(st.ip_addresses(v=4).map(str), port)


def ipv6_hosts(port: st.SearchStrategy[int] = ports) -> st.SearchStrategy[Host]:
    """``(ip, port)`` with an IPv6 address in the canonical (compressed) form decode returns."""
    return st.tuples(st.ip_addresses(v=6).map(str), port)


def hosts(
    *, ipv6: bool | None = None, port: st.SearchStrategy[int] = ports
) -> st.SearchStrategy[Host]:
    """IPv4 hosts (``ipv6=False``), IPv6 hosts (``True``) or either (``None``)."""
    if ipv6 is None:
        return ipv4_hosts(port) | ipv6_hosts(port)
    return ipv6_hosts(port) if ipv6 else ipv4_hosts(port)


# --- sysflag -------------------------------------------------------------------------------

_TRANSACTION_TYPES = (
    sf.TRANSACTION_NOT_TYPE,
    sf.TRANSACTION_PREPARED_TYPE,
    sf.TRANSACTION_COMMIT_TYPE,
    sf.TRANSACTION_ROLLBACK_TYPE,
)


def sysflags(*, compressed: bool | None = None) -> st.SearchStrategy[int]:
    """SYSFLAG values a message carries before encode: the COMPRESSED, MULTI_TAGS and
    transaction bits only (encode derives the host v6 bits itself).

    ``compressed`` forces the COMPRESSED bit on or off; ``None`` draws it.
    """
    compressed_bit = (
        st.sampled_from((0, sf.COMPRESSED)) if compressed is None
        else st.just(sf.COMPRESSED if compressed else 0)
    )
    return st.builds(
        lambda c, m, t: c | m | t,
        compressed_bit,
        st.sampled_from((0, sf.MULTI_TAGS)),
        st.sampled_from(_TRANSACTION_TYPES),
    )


# --- messages ------------------------------------------------------------------------------


def _properties_with(
    extra: st.SearchStrategy[dict[str, str]],
) -> st.SearchStrategy[dict[str, str]]:
    """``extra`` plus, sometimes, TAGS, KEYS and UNIQ_KEY under their literal names."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, str]:
        props = dict(draw(extra))
        if draw(st.booleans()):
            props[Prop.TAGS] = draw(tags)
        if draw(st.booleans()):
            props[Prop.KEYS] = " ".join(draw(key_lists))
        if draw(st.booleans()):
            props[Prop.UNIQ_KEY] = draw(keys)
        return props

    return build()


def messages(
    *,
    topic: st.SearchStrategy[str] = codec_topics,
    body: st.SearchStrategy[bytes] = bodies,
    props: st.SearchStrategy[dict[str, str]] = properties,
    queue_id: st.SearchStrategy[int] = non_negative_int32s,
    sysflag: st.SearchStrategy[int] | None = None,
    born_host: st.SearchStrategy[Host] | None = None,
    store_host: st.SearchStrategy[Host] | None = None,
    ipv6: bool | None = None,
) -> st.SearchStrategy[Message]:
    """Full :class:`Message` objects with every stored field drawn.

    ``body`` draws the producer's payload: when the drawn sysflag has the COMPRESSED bit the
    stored body is its zlib form, so :meth:`Message.payload` always works.  ``ipv6`` picks the
    host family for both hosts unless ``born_host``/``store_host`` are given (store tests that
    serve clients want ``ipv6=False``: the v1 layout).  ``props`` draws the free-form
    properties; TAGS, KEYS and UNIQ_KEY are added on top now and then.
    """
    flags = sysflags() if sysflag is None else sysflag
    born = hosts(ipv6=ipv6, port=host_ports) if born_host is None else born_host
    store = hosts(ipv6=ipv6, port=host_ports) if store_host is None else store_host
    all_props = _properties_with(props)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        flag_bits = draw(flags)
        payload = draw(body)
        return Message(
            topic=draw(topic),
            body=zlib.compress(payload, 5) if flag_bits & sf.COMPRESSED else payload,
            flag=draw(int32s),
            properties=draw(all_props),
            queue_id=draw(queue_id),
            sysflag=flag_bits,
            born_timestamp=draw(timestamps),
            born_host=draw(born),
            store_timestamp=draw(timestamps),
            store_host=draw(store),
            reconsume_times=draw(non_negative_int32s),
            prepared_transaction_offset=draw(non_negative_int64s),
            queue_offset=draw(non_negative_int64s),
            commit_log_offset=draw(non_negative_int64s),
        )

    return build()


def put_records(
    message: st.SearchStrategy[Message] | None = None,
) -> st.SearchStrategy[PutRecord]:
    """:class:`PutRecord` objects made by :func:`put_record` from ``message`` draws
    (default: :func:`messages` with IPv4 hosts, the layout every client reads)."""
    return (messages(ipv6=False) if message is None else message).map(put_record)


# --- queues and consumers ------------------------------------------------------------------

rooms = st.sampled_from(["r0", "r1", "r2", "r3"])
"""Machine rooms: few, so rooms with and without consumers both turn up."""

_BROKER_ALPHABET = TOPIC_ALPHABET.replace("%", "").replace("|", "")


def message_queues() -> st.SearchStrategy[MessageQueue]:
    """Queues of a few short topics on brokers named ``<room>@<name>``, so that every
    allocation strategy, the machine-room ones included, can take them."""
    return st.builds(
        MessageQueue,
        topic=st.text(TOPIC_ALPHABET, min_size=1, max_size=3),
        broker_name=st.builds(
            "{}@{}".format, rooms, st.text(_BROKER_ALPHABET, min_size=1, max_size=3)
        ),
        queue_id=st.integers(0, 31),
    )


queue_lists = st.lists(message_queues(), min_size=1, max_size=40, unique=True)
"""The queues of a rebalance: non-empty, distinct."""

client_ids = st.builds(
    "{}@{}".format, rooms, st.text(st.characters(codec="utf-8"), min_size=1, max_size=6)
)
"""Consumer ids ``<room>@<anything>``; the tail draws any code point so that Java's UTF-16
ordering (which differs from Python's above U+FFFF) is exercised."""

client_id_lists = st.lists(client_ids, min_size=1, max_size=12, unique=True)
"""A group's id list as a well-run group has it: non-empty, every id once."""
# --- remoting commands -----------------------------------------------------------------------

_INT16 = st.integers(-(2**15), 2**15 - 1)
_header_texts = st.text(_UTF8_CHARS, max_size=32)


def remoting_commands(
    *, serialize_type: SerializeType | None = None, body: st.SearchStrategy[bytes] = bodies
) -> st.SearchStrategy[RemotingCommand]:
    """Commands every serialization carries unchanged: codes and versions fit the binary
    header's int16 fields, and a binary remark is never ``""`` (its length 0 means none).

    ``serialize_type`` fixes the serialization; ``None`` draws it.
    """
    kinds = st.sampled_from(SerializeType) if serialize_type is None else st.just(serialize_type)

    @st.composite
    def build(draw: st.DrawFn) -> RemotingCommand:
        kind = draw(kinds)
        remark = draw(st.none() | _header_texts)
        return RemotingCommand(
            code=draw(_INT16),
            language=draw(st.sampled_from(LanguageCode)),
            version=draw(_INT16),
            opaque=draw(int32s),
            flag=draw(int32s),
            remark=None if kind is SerializeType.ROCKETMQ and not remark else remark,
            ext_fields=draw(st.dictionaries(_header_texts, _header_texts, max_size=8)),
            body=draw(body),
            serialize_type=kind,
        )

    return build()
