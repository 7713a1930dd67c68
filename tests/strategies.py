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

from evq.domain import sql92 as sql
from evq.domain import sysflag as sf
from evq.domain.filters import TAG_SEPARATOR
from evq.domain.javalang import java_trim
from evq.domain.message import Host, Message, Prop
from evq.domain.queues import MessageQueue
from evq.domain.record import MAX_TOPIC_BYTES, PutRecord, put_record
from evq.domain.topics import NOT_ALLOWED_SEND, RETRY_PREFIX, TopicConfig, TopicFilterType
from evq.net.codes import LanguageCode
from evq.net.protocol import RemotingCommand, SerializeType

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "SQL_PROPERTY_NAMES",
    "SYSTEM_PROPERTY_NAMES",
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
    "not_system_property",
    "ports",
    "properties",
    "property_names",
    "property_values",
    "put_records",
    "queue_lists",
    "remoting_commands",
    "rooms",
    "sendable_topics",
    "sql_conditions",
    "sql_properties",
    "sql_property_names",
    "sql_property_values",
    "sql_values",
    "subscription_tag_sets",
    "subscription_tags",
    "sysflags",
    "tag_expressions",
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

sendable_topics = topics.filter(lambda t: t not in NOT_ALLOWED_SEND and t != RETRY_PREFIX)
"""Topic names a producer may send to: the broker writes its system topics itself, and a
retry topic names its consumer group after the prefix, which the bare prefix leaves blank (the
broker refuses the blank group, as RocketMQ finds no such subscription group).

Hypothesis draws string constants from the code under test, so the reserved names
(``EVQ_SYS_TIMER``, ``SCHEDULE_TOPIC_XXXX``, ``%RETRY%``, ...) do come up and must be left out
here.
"""

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

SYSTEM_PROPERTY_NAMES = frozenset(v for k, v in vars(Prop).items() if not k.startswith("_"))
"""The property names clients and brokers act on (RocketMQ's ``MessageConst``, which its Java
client refuses as user properties): a broker strips WAIT, sets CLUSTER, moves a DELAY or a
future ``__STARTDELIVERTIME`` to a system topic.  Hypothesis draws string constants from the
code under test, so a test that checks user properties round trip through a broker draws
its names without these (``not_system_property``)."""


def not_system_property(name: str) -> bool:
    return name not in SYSTEM_PROPERTY_NAMES
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
# --- subscriptions and SQL92 selectors -------------------------------------------------------

_TAG_BLANKS = st.text(st.sampled_from(" \t\x00\x1f"), max_size=3)
"""Characters Java's ``String.trim`` removes around a subscribed tag."""

subscription_tags = tags.filter(
    lambda t: t == java_trim(t) and t != "*" and TAG_SEPARATOR not in t
    and not t.startswith("|") and not t.endswith("|")
)
"""One tag of a tag expression: nothing ``trim`` would strip, no ``||`` and no ``|`` at an end
(which would merge with a separator), and not the match-all ``*``."""

subscription_tag_sets = st.frozensets(subscription_tags, min_size=1, max_size=5)


@st.composite
def tag_expressions(draw: st.DrawFn, tag_set: frozenset[str]) -> str:
    """``tag_set`` written as a tag expression: any order, blanks around each tag, and now and
    then an empty part (``a |||| b``)."""
    parts: list[str] = []
    for tag in draw(st.permutations(sorted(tag_set))):
        parts.extend("" for _ in range(draw(st.integers(0, 1))))
        parts.append(draw(_TAG_BLANKS) + tag + draw(_TAG_BLANKS))
    return TAG_SEPARATOR.join(parts)


SQL_PROPERTY_NAMES = ("a", "b", "Region", "TAGS", "_n1", "$v")
"""A small pool, so that drawn selectors and drawn property maps name the same properties."""

sql_property_names = st.sampled_from(SQL_PROPERTY_NAMES)

sql_property_values = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from([
        "0", "-0", "+7", "2147483648", "-2147483649", "1.5", "-0.0", " 2.5 ", "1e3", "1.5f",
        "0x1p3", "NaN", "Infinity", "-Infinity", "nan", "1_000", "\u0663", "true", "TRUE",
        "false", "yes", "", "abc", "'",
    ]),
    st.text(max_size=6),
)
"""Property values that exercise Java's conversions: ints, longs, beyond long, doubles in
Java's and Python's spellings, booleans, and plain text."""

sql_properties = st.dictionaries(sql_property_names, sql_property_values, max_size=6)

_sql_integers = st.one_of(
    st.integers(0, 20), st.integers(0, INT64_MAX), st.sampled_from([INT32_MAX, INT32_MAX + 1])
).map(sql.IntegerLiteral)
_sql_decimals = st.one_of(
    st.sampled_from([0.5, 1.5, 2.0, 1e-300, 5e-324, 1.7976931348623157e308]),
    st.floats(min_value=5e-324, allow_nan=False, allow_infinity=False),
).map(sql.DecimalLiteral)
_sql_numbers = _sql_integers | _sql_decimals
_sql_strings = st.one_of(sql_property_values, st.text(max_size=8)).map(sql.StringLiteral)
_sql_properties = sql_property_names.map(sql.Property)
_sql_booleans = st.sampled_from([True, False, None]).map(sql.BooleanLiteral)
_sql_leaves = _sql_properties | _sql_numbers | _sql_strings | _sql_booleans


def _ordered_operands() -> st.SearchStrategy[sql.Expr]:
    """What RocketMQ lets stand beside < > <= >= and BETWEEN."""
    return _sql_properties | _sql_numbers | st.builds(sql.Negate, sql_values)


def _equality_operands() -> st.SearchStrategy[sql.Expr]:
    return sql_values.filter(lambda node: node != sql.BooleanLiteral(None))


def _equality_allowed(left: sql.Expr, right: sql.Expr) -> bool:
    """RocketMQ refuses a TRUE/FALSE constant equated with a non-boolean constant."""
    return not (
        isinstance(left, sql.BooleanLiteral)
        and isinstance(right, sql.CONSTANTS)
        and not isinstance(right, sql.BooleanLiteral)
    )


def _bounds_in_order(node: sql.Between) -> bool:
    low, high = node.low, node.high
    if node.negated or not (isinstance(low, sql.NUMBERS) and isinstance(high, sql.NUMBERS)):
        return True
    if isinstance(low.value, float) or isinstance(high.value, float):
        return float(low.value) <= float(high.value)
    return low.value <= high.value


sql_conditions: st.SearchStrategy[sql.Expr] = st.deferred(
    lambda: st.one_of(
        _sql_properties,
        _sql_booleans,
        st.builds(sql.Not, sql_conditions),
        st.builds(
            sql.Comparison, st.sampled_from(sql.ORDERING_OPERATORS),
            _ordered_operands(), _ordered_operands(),
        ),
        st.builds(
            sql.Comparison, st.sampled_from(sql.EQUALITY_OPERATORS),
            _equality_operands(), _equality_operands(),
        ).filter(lambda node: _equality_allowed(node.left, node.right)),
        st.builds(sql.IsNull, sql_values, st.booleans()),
        st.builds(
            sql.Between, _ordered_operands(), _ordered_operands(), _ordered_operands(),
            st.booleans(),
        ).filter(_bounds_in_order),
        st.builds(
            sql.In, _sql_properties,
            st.lists(sql_property_values, min_size=1, max_size=4).map(tuple), st.booleans(),
        ),
        st.lists(sql_conditions, min_size=2, max_size=4).map(lambda ops: sql.And.of(*ops)),
        st.lists(sql_conditions, min_size=2, max_size=4).map(lambda ops: sql.Or.of(*ops)),
    )
)
"""Well-formed selector trees: every node passes RocketMQ's construction checks, so rendered
to text each one parses back to itself.  A bare property counts (RocketMQ casts it)."""

sql_values: st.SearchStrategy[sql.Expr] = st.deferred(
    lambda: _sql_leaves | st.builds(sql.Negate, sql_values) | sql_conditions
)
"""Any well-formed expression, condition or not (the operands of ``=`` and ``IS NULL``)."""
