"""The stored-record codec (evq.domain.record) against the documented RocketMQ layout.

Reference: docs/rocketmq-wire-and-store.md §3.1 (record), §3.2 (offsetMsgId), §3.8 (batch).
"""

from __future__ import annotations

import ipaddress
import re
import struct
import zlib
from collections.abc import Mapping

import attrs
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from evq.domain import sysflag as sf
from evq.domain.hashing import tags_code
from evq.domain.message import (
    Host,
    Message,
    Prop,
    decode_properties,
    encode_properties,
    new_message,
)
from evq.domain.record import (
    BLANK_MAGIC,
    BORN_HOST_AT,
    HEADER_V4,
    HEADER_V4_SIZE,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_AT,
    QUEUE_OFFSET_AT,
    SYSFLAG_AT,
    PutRecord,
    RecordError,
    body_crc,
    decode,
    decode_batch,
    encode,
    encode_batch,
    encode_blank,
    index_keys_of,
    iter_records,
    offset_msg_id,
    parse_offset_msg_id,
    peek,
    put_record,
    read_fields,
    store_timestamp_at,
)
from tests.strategies import (
    bodies,
    hosts,
    int32s,
    ipv4_hosts,
    ipv6_hosts,
    messages,
    non_negative_int64s,
    properties,
    property_names,
    property_values,
    put_records,
    sysflags,
    unicode_topics,
    wide_ports,
)

V6_BITS = sf.BORNHOST_V6 | sf.STOREHOST_V6

# Cheaper messages for tests about bytes rather than content: small bodies, few properties
# (a full messages() draw costs several ms, mostly its property map).
small_messages = messages(
    body=st.binary(max_size=64),
    props=st.dictionaries(property_names, property_values, max_size=2),
)
# A batch entry carries only flag, body and properties.
batch_messages = st.builds(
    Message, topic=st.just("T"), body=st.binary(max_size=256), flag=int32s, properties=properties
)

NON_ASCII = Message(
    topic="主题-τοπίο-🚀",
    body=b"",
    properties={
        Prop.TAGS: "标签 ü",
        Prop.KEYS: "ключ 鍵 🔑",
        Prop.UNIQ_KEY: "ユニーク",
        "名前": "値\x00\x7f",
        "empty": "",
    },
    born_host=("fe80::1", 65535),
    store_host=("10.1.2.3", 10911),
)


def host_raw(host: Host) -> bytes:
    ip, port = host
    return ipaddress.ip_address(ip).packed + struct.pack(">I", port)


def hand_built(m: Message, *, magic: int = MAGIC_V1) -> bytes:
    """§3.1 built field by field with struct, independently of evq's encoder.

    With ``MAGIC_V2`` the topic length is an int16 (RocketMQ 5.x); otherwise a signed byte.
    """
    topic = m.topic.encode()
    props = "".join(f"{k}\x01{v}\x02" for k, v in m.properties.items()).encode()
    flags = m.sysflag & ~V6_BITS
    if ipaddress.ip_address(m.born_host[0]).version == 6:
        flags |= sf.BORNHOST_V6
    if ipaddress.ip_address(m.store_host[0]).version == 6:
        flags |= sf.STOREHOST_V6
    topic_len = struct.pack(">b" if magic == MAGIC_V1 else ">h", len(topic))
    rest = b"".join(
        [
            struct.pack(">I", zlib.crc32(m.body) & 0x7FFFFFFF),
            struct.pack(">iiqqiq", m.queue_id, m.flag, m.queue_offset, m.commit_log_offset,
                        flags, m.born_timestamp),
            host_raw(m.born_host),
            struct.pack(">q", m.store_timestamp),
            host_raw(m.store_host),
            struct.pack(">iqi", m.reconsume_times, m.prepared_transaction_offset, len(m.body)),
            m.body,
            topic_len,
            topic,
            struct.pack(">h", len(props)),
            props,
        ]
    )
    return struct.pack(">ii", 8 + len(rest), magic) + rest


def assert_only_record_errors(data: bytes | bytearray, pos: int = 0) -> None:
    """decode and read_fields either succeed and agree, or raise RecordError; nothing else."""
    try:
        fields = read_fields(data, pos, check_crc=False)
    except RecordError:
        fields = None
    try:
        m = decode(data, pos, check_crc=False)
    except RecordError:
        m = None
    assert (fields is None) == (m is None), "read_fields and decode disagree on validity"
    if fields is not None and m is not None:
        assert fields.topic == m.topic
        assert decode_properties(fields.properties) == m.properties
        assert fields.queue_id == m.queue_id
        assert fields.store_timestamp == m.store_timestamp


# --- round trip ------------------------------------------------------------------------------


@given(messages())
@example(NON_ASCII)
@example(Message(topic="t"))
def test_decode_inverts_encode(m: Message) -> None:
    data = encode(m)
    back = decode(data)
    assert back == m
    assert back.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
    assert decode(bytes(data)) == m
    assert decode(memoryview(data)) == m


@given(small_messages, hosts(port=wide_ports), hosts(port=wide_ports))
def test_host_families_round_trip_and_set_v6_bits(m: Message, born: Host, store: Host) -> None:
    m = attrs.evolve(m, born_host=born, store_host=store)
    data = encode(m)
    v6 = (sf.BORNHOST_V6 if ":" in born[0] else 0) | (sf.STOREHOST_V6 if ":" in store[0] else 0)
    assert struct.unpack_from(">i", data, SYSFLAG_AT)[0] & V6_BITS == v6
    back = decode(data)
    assert back == m
    assert (back.born_host, back.store_host) == (born, store)
    assert back.sysflag & V6_BITS == 0  # decode hands back the message's own bits only


@given(unicode_topics, properties, bodies)
def test_unicode_topic_and_properties_round_trip(
    topic: str, props: dict[str, str], body: bytes
) -> None:
    m = Message(topic=topic, body=body, properties=props)
    back = decode(encode(m))
    assert back.topic == topic
    assert back.properties == props
    assert back.body == body


def test_empty_body_record_is_minimum_size() -> None:
    data = encode(Message(topic="T"))
    assert len(data) == MIN_RECORD_SIZE + 1
    assert struct.unpack_from(">i", data, 84)[0] == 0
    assert decode(data).body == b""


@given(messages())
def test_encode_matches_hand_built_layout(m: Message) -> None:
    data = bytes(encode(m))
    assert data == hand_built(m)
    hosts_extra = 12 * ((":" in m.born_host[0]) + (":" in m.store_host[0]))
    topic_len = len(m.topic.encode())
    props_len = len(encode_properties(m.properties).encode())
    assert len(data) == 91 + hosts_extra + len(m.body) + topic_len + props_len


@given(messages(ipv6=False))
def test_v1_ipv4_offsets_are_as_documented(m: Message) -> None:
    data = bytes(encode(m))
    topic, props = m.topic.encode(), "".join(f"{k}\x01{v}\x02" for k, v in m.properties.items())
    b, t, p = len(m.body), len(topic), len(props.encode())
    assert len(data) == 91 + b + t + p
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    assert data[4:8] == bytes.fromhex("DAA320A7")
    assert struct.unpack_from(">I", data, 8)[0] == zlib.crc32(m.body) & 0x7FFFFFFF
    assert struct.unpack_from(">i", data, 12)[0] == m.queue_id
    assert struct.unpack_from(">i", data, 16)[0] == m.flag
    assert struct.unpack_from(">q", data, 20)[0] == m.queue_offset
    assert struct.unpack_from(">q", data, 28)[0] == m.commit_log_offset
    assert struct.unpack_from(">i", data, 36)[0] == m.sysflag
    assert struct.unpack_from(">q", data, 40)[0] == m.born_timestamp
    assert data[48:56] == host_raw(m.born_host)
    assert struct.unpack_from(">q", data, 56)[0] == m.store_timestamp
    assert data[64:72] == host_raw(m.store_host)
    assert struct.unpack_from(">i", data, 72)[0] == m.reconsume_times
    assert struct.unpack_from(">q", data, 76)[0] == m.prepared_transaction_offset
    assert struct.unpack_from(">i", data, 84)[0] == b
    assert data[88 : 88 + b] == m.body
    assert struct.unpack_from(">b", data, 88 + b)[0] == t
    assert data[89 + b : 89 + b + t] == topic
    assert struct.unpack_from(">h", data, 89 + b + t)[0] == p
    assert data[91 + b + t :] == props.encode()
    # The module's own offset constants and fixed-header struct say the same.
    assert (QUEUE_OFFSET_AT, PHYSICAL_OFFSET_AT, SYSFLAG_AT, BORN_HOST_AT) == (20, 28, 36, 48)
    assert HEADER_V4_SIZE == 88
    assert HEADER_V4.unpack_from(data, 0) == (
        len(data), MAGIC_V1, zlib.crc32(m.body) & 0x7FFFFFFF, m.queue_id, m.flag,
        m.queue_offset, m.commit_log_offset, m.sysflag, m.born_timestamp,
        host_raw(m.born_host), m.store_timestamp, host_raw(m.store_host), m.reconsume_times,
        m.prepared_transaction_offset, b,
    )


@given(small_messages)
def test_store_timestamp_at_finds_the_store_timestamp(m: Message) -> None:
    data = encode(m)
    flags = struct.unpack_from(">i", data, SYSFLAG_AT)[0]
    at = store_timestamp_at(flags)
    assert at == (68 if flags & sf.BORNHOST_V6 else 56)
    assert struct.unpack_from(">q", data, at)[0] == m.store_timestamp


# --- read_fields -----------------------------------------------------------------------------


@given(small_messages, st.binary(max_size=32), st.binary(max_size=32))
def test_read_fields_agrees_with_decode(m: Message, before: bytes, after: bytes) -> None:
    data = before + bytes(encode(m)) + after
    pos = len(before)
    fields = read_fields(data, pos, check_crc=True)
    back = decode(data, pos)
    assert back == m
    assert fields.size == len(data) - len(before) - len(after)
    assert fields.queue_id == back.queue_id
    assert fields.queue_offset == back.queue_offset
    assert fields.physical_offset == back.commit_log_offset
    assert fields.store_timestamp == back.store_timestamp
    assert fields.topic == back.topic
    assert decode_properties(fields.properties) == back.properties
    assert fields.crc_ok
    # read_fields reports the stored SYSFLAG (host v6 bits included); decode strips those.
    assert fields.sysflag & ~V6_BITS == back.sysflag
    v6 = (sf.BORNHOST_V6 if ":" in m.born_host[0] else 0) | (
        sf.STOREHOST_V6 if ":" in m.store_host[0] else 0
    )
    assert fields.sysflag & V6_BITS == v6


# --- body CRC --------------------------------------------------------------------------------


def test_body_crc_is_masked_crc32() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
    assert body_crc(b"123456789") == 0x4BF43926
    assert body_crc(b"") == 0


@given(bodies)
def test_body_crc_is_crc32_without_the_sign_bit(body: bytes) -> None:
    crc = body_crc(body)
    assert crc == zlib.crc32(body) & 0x7FFFFFFF
    assert 0 <= crc <= 0x7FFFFFFF
    assert body_crc(memoryview(body)) == crc


@given(small_messages.filter(lambda m: m.body), st.data())
def test_corrupt_body_byte_fails_crc(m: Message, data: st.DataObject) -> None:
    raw = bytearray(encode(m))
    body_at = _body_offset(raw)
    i = data.draw(st.integers(0, len(m.body) - 1), label="body index")
    new = data.draw(st.integers(0, 255).filter(lambda v: v != m.body[i]), label="new byte")
    raw[body_at + i] = new
    corrupted = bytes(raw[body_at : body_at + len(m.body)])
    # Masking drops bit 31, so only a change confined to that bit could go unseen.
    assume(body_crc(corrupted) != body_crc(m.body))
    with pytest.raises(RecordError, match="CRC"):
        decode(raw, check_crc=True)
    assert read_fields(raw, 0, check_crc=True).crc_ok is False
    assert read_fields(raw, 0, check_crc=False).crc_ok is True
    assert decode(raw, check_crc=False).body == corrupted
    with pytest.raises(RecordError):
        list(iter_records(raw))


def _body_offset(raw: bytes | bytearray) -> int:
    flags = struct.unpack_from(">i", raw, SYSFLAG_AT)[0]
    born = 20 if flags & sf.BORNHOST_V6 else 8
    store = 20 if flags & sf.STOREHOST_V6 else 8
    return BORN_HOST_AT + born + 8 + store + 16


# --- malformed input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "m",
    [Message(topic="T", body=b"xyz", properties={"a": "b"}), NON_ASCII],
    ids=["ipv4", "ipv6-non-ascii"],
)
def test_every_truncation_raises_record_error(m: Message) -> None:
    data = bytes(encode(m))
    for n in range(len(data)):
        with pytest.raises(RecordError):
            decode(data[:n])
        with pytest.raises(RecordError):
            read_fields(data[:n], 0, check_crc=False)


@given(small_messages, st.data())
def test_truncation_with_patched_total_size_raises_record_error(
    m: Message, data: st.DataObject
) -> None:
    """A cut record whose TOTALSIZE was rewritten to match: the fields no longer add up."""
    raw = bytes(encode(m))
    n = data.draw(st.integers(MIN_RECORD_SIZE, len(raw) - 1), label="cut at")
    cut = bytearray(raw[:n])
    struct.pack_into(">i", cut, 0, n)
    with pytest.raises(RecordError):
        decode(cut)
    with pytest.raises(RecordError):
        read_fields(cut, 0, check_crc=False)


@given(small_messages, st.integers(1, 64))
def test_total_size_larger_than_buffer_raises(m: Message, extra: int) -> None:
    raw = bytearray(encode(m))
    struct.pack_into(">i", raw, 0, len(raw) + extra)
    with pytest.raises(RecordError):
        decode(raw)
    with pytest.raises(RecordError):
        read_fields(raw, 0, check_crc=True)


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_record_error(garbage: bytes) -> None:
    with pytest.raises(RecordError):
        decode(garbage)
    with pytest.raises(RecordError):
        read_fields(garbage, 0, check_crc=True)


@given(
    st.sampled_from([MAGIC_V1, MAGIC_V2]),
    st.integers(-(2**31), 400),
    st.binary(min_size=MIN_RECORD_SIZE - 8, max_size=400),
)
def test_garbage_with_plausible_magic_raises_only_record_error(
    magic: int, size: int, rest: bytes
) -> None:
    assert_only_record_errors(struct.pack(">ii", size, magic) + rest)


@given(
    small_messages,
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_mutated_records_raise_only_record_error(
    m: Message, edits: list[tuple[int, int]]
) -> None:
    raw = bytearray(encode(m))
    for i, v in edits:
        raw[i % len(raw)] = v
    assert_only_record_errors(raw)


LYING = Message(topic="T", body=b"xyz", properties={"a": "b"})  # B=3, T=1, P=4


@pytest.mark.parametrize("value", [-1, 0, 2, 4, 5, 0x7F, 0x7FFFFFFF, -(2**31)])
def test_lying_body_length_raises_record_error(value: int) -> None:
    raw = bytearray(encode(LYING))
    struct.pack_into(">i", raw, 84, value)
    with pytest.raises(RecordError):
        decode(raw, check_crc=False)
    with pytest.raises(RecordError):
        read_fields(raw, 0, check_crc=False)


@pytest.mark.parametrize("value", [0, 2, 6, 0x7F, 0x80, 0xFF])
def test_lying_topic_length_raises_record_error(value: int) -> None:
    raw = bytearray(encode(LYING))
    raw[88 + 3] = value
    with pytest.raises(RecordError):
        decode(raw)
    with pytest.raises(RecordError):
        read_fields(raw, 0, check_crc=False)


@pytest.mark.parametrize("value", [-1, 0, 3, 5, 0x7FFF, -(2**15)])
def test_lying_properties_length_raises_record_error(value: int) -> None:
    raw = bytearray(encode(LYING))
    struct.pack_into(">h", raw, 89 + 3 + 1, value)
    with pytest.raises(RecordError):
        decode(raw)
    with pytest.raises(RecordError):
        read_fields(raw, 0, check_crc=False)


def test_undecodable_topic_raises_record_error() -> None:
    raw = bytearray(encode(Message(topic="T", body=b"")))
    raw[89] = 0xFF  # the one topic byte
    with pytest.raises(RecordError, match="undecodable"):
        decode(raw)
    with pytest.raises(RecordError, match="undecodable"):
        read_fields(raw, 0, check_crc=False)


def test_blank_record_is_not_a_message() -> None:
    blank = encode_blank(4096) + bytes(4088)
    assert peek(blank, 0) == (4096, BLANK_MAGIC)
    assert peek(blank[:7], 0) == (0, 0)
    with pytest.raises(RecordError, match="magic"):
        read_fields(blank, 0, check_crc=True)
    with pytest.raises(RecordError):
        decode(blank)


@given(small_messages)
def test_peek_reads_size_and_magic(m: Message) -> None:
    data = encode(m)
    assert peek(data, 0) == (len(data), MAGIC_V1)


# --- encoder limits --------------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["x" * 128, "é" * 64, "🚀" * 32, "x" * 1000, ""])
def test_topic_outside_1_to_127_bytes_is_rejected(topic: str) -> None:
    with pytest.raises(RecordError, match="topic"):
        encode(Message(topic=topic))


@pytest.mark.parametrize("topic", ["x" * 127, "é" * 63 + "x", "🚀" * 31 + "abc"])
def test_topic_of_127_bytes_is_accepted(topic: str) -> None:
    assert len(topic.encode()) == 127
    data = encode(Message(topic=topic))
    assert data[88] == 127
    assert decode(data).topic == topic


def test_properties_over_32767_bytes_are_rejected() -> None:
    # "k\x01" + value + "\x02": 3 bytes of framing.
    with pytest.raises(RecordError, match="properties"):
        encode(Message(topic="T", properties={"k": "v" * 32765}))
    with pytest.raises(RecordError, match="properties"):
        encode(Message(topic="T", properties={"k": "é" * 16383}))  # 32766 + 3 bytes


def test_properties_of_exactly_32767_bytes_are_accepted() -> None:
    m = Message(topic="T", properties={"k": "v" * 32764})
    data = encode(m)
    assert struct.unpack_from(">h", data, 89 + 1)[0] == 32767
    assert decode(data) == m


# --- message ids -----------------------------------------------------------------------------

HEX32 = re.compile(r"[0-9A-F]{32}")
HEX56 = re.compile(r"[0-9A-F]{56}")


def test_offset_msg_id_known_value() -> None:
    msg_id = offset_msg_id(("10.0.0.1", 10911), 0x1234)
    assert msg_id == "0A00000100002A9F0000000000001234"
    assert parse_offset_msg_id(msg_id) == (("10.0.0.1", 10911), 0x1234)


@given(ipv4_hosts(wide_ports), non_negative_int64s)
def test_ipv4_offset_msg_id_is_32_uppercase_hex_and_inverts(host: Host, offset: int) -> None:
    msg_id = offset_msg_id(host, offset)
    assert HEX32.fullmatch(msg_id)
    assert parse_offset_msg_id(msg_id) == (host, offset)
    assert parse_offset_msg_id(msg_id.lower()) == (host, offset)
    assert offset_msg_id(host_raw(host), offset) == msg_id


@given(ipv6_hosts(wide_ports), non_negative_int64s)
def test_ipv6_offset_msg_id_is_56_hex_and_inverts(host: Host, offset: int) -> None:
    msg_id = offset_msg_id(host, offset)
    assert HEX56.fullmatch(msg_id)
    assert parse_offset_msg_id(msg_id) == (host, offset)


@given(small_messages)
def test_offset_msg_id_is_store_host_bytes_and_physical_offset(m: Message) -> None:
    data = bytes(encode(m))
    at = store_timestamp_at(struct.unpack_from(">i", data, SYSFLAG_AT)[0]) + 8
    store_len = 20 if ":" in m.store_host[0] else 8
    expected = (data[at : at + store_len] + data[28:36]).hex().upper()
    assert offset_msg_id(m.store_host, m.commit_log_offset) == expected


@pytest.mark.parametrize("bad", ["", "0A000001", "0" * 31, "0" * 33, "0" * 64])
def test_parse_offset_msg_id_rejects_wrong_lengths(bad: str) -> None:
    with pytest.raises(ValueError, match="32 or 56"):
        parse_offset_msg_id(bad)


# --- batches ---------------------------------------------------------------------------------


@given(st.lists(batch_messages, max_size=6))
def test_decode_batch_inverts_encode_batch(ms: list[Message]) -> None:
    entries = decode_batch(encode_batch(ms))
    assert [(e.flag, e.body, e.properties) for e in entries] == [
        (m.flag, m.body, m.properties) for m in ms
    ]


@given(int32s, bodies, properties)
def test_batch_entry_layout(flag: int, body: bytes, props: dict[str, str]) -> None:
    raw = encode_batch([Message(topic="ignored", body=body, flag=flag, properties=props)])
    encoded_props = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
    b, p = len(body), len(encoded_props)
    assert len(raw) == 20 + b + 2 + p
    assert struct.unpack_from(">iiiii", raw, 0) == (20 + b + 2 + p, 0, 0, flag, b)
    assert raw[20 : 20 + b] == body
    assert struct.unpack_from(">h", raw, 20 + b)[0] == p
    assert raw[22 + b :] == encoded_props


def test_empty_batch() -> None:
    assert encode_batch([]) == b""
    assert decode_batch(b"") == []


def test_batch_accepts_java_properties_without_trailing_separator() -> None:
    props = b"TAGS\x01a\x02KEYS\x01k1 k2"
    raw = struct.pack(">iiiii", 20 + 2 + 2 + len(props), 0, 0, 7, 2) + b"hi"
    raw += struct.pack(">h", len(props)) + props
    [entry] = decode_batch(raw)
    assert (entry.flag, entry.body, entry.properties) == (7, b"hi", {"TAGS": "a", "KEYS": "k1 k2"})


@given(st.binary(max_size=400))
def test_decode_batch_garbage_raises_only_record_error(garbage: bytes) -> None:
    try:
        entries = decode_batch(garbage)
    except RecordError:
        return
    # Whatever parses fills the input exactly: 22 bytes of framing per entry plus its body.
    assert 22 * len(entries) + sum(len(e.body) for e in entries) <= len(garbage)
    assert bool(entries) == bool(garbage)


@given(
    st.lists(batch_messages, min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_decode_batch_mutations_raise_only_record_error(
    ms: list[Message], edits: list[tuple[int, int]]
) -> None:
    raw = bytearray(encode_batch(ms))
    for i, v in edits:
        raw[i % len(raw)] = v
    try:
        entries = decode_batch(bytes(raw))
    except RecordError:
        return
    assert all(isinstance(e.body, bytes) and isinstance(e.properties, dict) for e in entries)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00" * 21,  # shorter than an entry head
        struct.pack(">iiiii", 21, 0, 0, 0, 0) + b"\x00\x00",  # size below 22 + body
        struct.pack(">iiiii", 22, 0, 0, 0, -1) + b"\x00\x00",  # negative body length
        struct.pack(">iiiii", 100, 0, 0, 0, 0) + b"\x00\x00",  # size past the end
        struct.pack(">iiiii", 22, 0, 0, 0, 0) + b"\x00\x05",  # properties past the entry
        struct.pack(">iiiii", 22, 0, 0, 0, 0) + b"\xff\xff",  # negative properties length
        struct.pack(">iiiii", 23, 0, 0, 0, 0) + b"\x00\x01\xff",  # undecodable properties
    ],
)
def test_decode_batch_rejects_malformed_entries(raw: bytes) -> None:
    with pytest.raises(RecordError):
        decode_batch(raw)


# --- iter_records ----------------------------------------------------------------------------


@given(st.lists(small_messages, max_size=3))
def test_iter_records_yields_every_concatenated_record(ms: list[Message]) -> None:
    buf = b"".join(bytes(encode(m)) for m in ms)
    assert list(iter_records(buf)) == ms
    assert list(iter_records(memoryview(buf), check_crc=False)) == ms


@given(st.lists(small_messages, min_size=1, max_size=2), st.binary(min_size=1, max_size=100))
def test_iter_records_raises_on_trailing_garbage(ms: list[Message], tail: bytes) -> None:
    buf = b"".join(bytes(encode(m)) for m in ms) + tail
    seen: list[Message] = []
    with pytest.raises(RecordError):
        seen.extend(iter_records(buf))
    assert seen == ms


# --- MAGIC_V2 --------------------------------------------------------------------------------


@given(messages())
@example(NON_ASCII)
def test_magic_v2_records_decode(m: Message) -> None:
    raw = hand_built(m, magic=MAGIC_V2)
    assert raw[4:8] == bytes.fromhex("DAA320AB")
    assert len(raw) == len(encode(m)) + 1  # the topic length takes two bytes
    assert decode(raw) == m
    fields = read_fields(raw, 0, check_crc=True)
    assert fields.size == len(raw)
    assert fields.topic == m.topic
    assert decode_properties(fields.properties) == m.properties
    assert fields.crc_ok


def test_magic_v2_topic_length_is_two_bytes() -> None:
    m = Message(topic="T" * 200, body=b"b")  # too long for v1, legal in a v2 record
    raw = hand_built(m, magic=MAGIC_V2)
    assert struct.unpack_from(">h", raw, 89)[0] == 200
    assert decode(raw).topic == m.topic
    assert read_fields(raw, 0, check_crc=True).topic == m.topic


# --- put_record ------------------------------------------------------------------------------


@given(messages())
def test_put_record_carries_the_routing_facts(m: Message) -> None:
    rec = put_record(m)
    assert bytes(rec.data) == bytes(encode(m))
    assert (rec.topic, rec.queue_id, rec.sysflag) == (m.topic, m.queue_id, m.sysflag)
    assert rec.tags_code == tags_code(m.properties.get(Prop.TAGS))
    if m.sysflag & sf.TRANSACTION_MASK == sf.TRANSACTION_ROLLBACK_TYPE:
        assert rec.keys == ()
    else:
        assert rec.keys == m.index_keys()
    # Recovery re-derives the same keys from the stored bytes.
    fields = read_fields(rec.data, 0, check_crc=True)
    assert index_keys_of(decode_properties(fields.properties), fields.sysflag) == rec.keys


def test_put_record_uses_the_tags_code_function() -> None:
    calls: list[tuple[str, dict[str, str], int]] = []

    def schedule_code(topic: str, props: Mapping[str, str], store_ts: int) -> int:
        calls.append((topic, dict(props), store_ts))
        return store_ts + 1000

    m = new_message("SCHEDULE_TOPIC_XXXX", b"x", tags="a", keys=["k1", "k2"])
    m.store_timestamp = 5
    rec = put_record(m, tags_code_fn=schedule_code)
    assert rec.tags_code == 1005
    assert calls == [("SCHEDULE_TOPIC_XXXX", {"TAGS": "a", "KEYS": "k1 k2"}, 5)]
    assert rec.keys == ("k1", "k2")


@given(put_records())
def test_put_records_strategy_yields_v1_records(rec: PutRecord) -> None:
    m = decode(rec.data)
    assert (m.topic, m.queue_id, m.sysflag) == (rec.topic, rec.queue_id, rec.sysflag)
    assert struct.unpack_from(">i", rec.data, SYSFLAG_AT)[0] & V6_BITS == 0
    # Bodies flagged COMPRESSED are real zlib data, so payload() works on drawn messages.
    payload = m.payload()
    if m.sysflag & sf.COMPRESSED:
        assert zlib.compress(payload, 5) == m.body
    else:
        assert payload == m.body


@given(sysflags(compressed=True), st.binary(max_size=256))
def test_compressed_messages_from_strategy_inflate(flags: int, payload: bytes) -> None:
    m = Message(topic="t", body=zlib.compress(payload), sysflag=flags)
    assert decode(encode(m)).payload() == payload


@given(hosts())
def test_hosts_strategy_yields_canonical_addresses(host: Host) -> None:
    ip, port = host
    assert str(ipaddress.ip_address(ip)) == ip
    assert 0 <= port <= 65535
