"""The message model and RocketMQ's properties string (evq.domain.message; doc §3.4, §3.7)."""

from __future__ import annotations

import zlib
from random import Random

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from evq.domain import sysflag as sf
from evq.domain.message import (
    COMPRESS_OVER,
    Message,
    Prop,
    PropertyError,
    decode_properties,
    encode_properties,
    host_bytes,
    is_ipv6,
    new_message,
    split_keys,
)
from tests.strategies import (
    bodies,
    key_lists,
    keys,
    properties,
    property_names,
    property_values,
    tags,
    topics,
)

# --- properties string -----------------------------------------------------------------------


def test_encode_properties_known_value() -> None:
    assert encode_properties({"TAGS": "a", "KEYS": "k1 k2"}) == "TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert encode_properties({}) == ""


@given(properties)
def test_properties_round_trip(props: dict[str, str]) -> None:
    text = encode_properties(props)
    assert decode_properties(text) == props
    assert text.count("\x02") == len(props)  # one trailing separator per entry (C++/ali-ons)


@given(properties.filter(bool))
def test_java_form_without_trailing_separator_decodes_the_same(props: dict[str, str]) -> None:
    text = encode_properties(props)
    assert text.endswith("\x02")
    assert decode_properties(text[:-1]) == props


def test_decode_properties_skips_malformed_pieces() -> None:
    # A piece without \x01 or with an empty name carries nothing; the first \x01 splits.
    assert decode_properties("noseparator\x02\x01value\x02a\x01b\x01c\x02\x02") == {"a": "b\x01c"}
    assert decode_properties("") == {}
    assert decode_properties("k\x01") == {"k": ""}


@given(property_names, property_values, st.sampled_from(["\x01", "\x02"]), st.integers(0, 64))
def test_separator_in_name_raises(name: str, value: str, sep: str, at: int) -> None:
    at %= len(name) + 1
    with pytest.raises(PropertyError):
        encode_properties({name[:at] + sep + name[at:]: value})


@given(property_names, property_values, st.sampled_from(["\x01", "\x02"]), st.integers(0, 64))
def test_separator_in_value_raises(name: str, value: str, sep: str, at: int) -> None:
    at %= len(value) + 1
    with pytest.raises(PropertyError):
        encode_properties({name: value[:at] + sep + value[at:]})


def test_empty_name_raises() -> None:
    with pytest.raises(PropertyError):
        encode_properties({"": "v"})
    assert issubclass(PropertyError, ValueError)


# --- new_message and compression ---------------------------------------------------------------


@pytest.mark.parametrize("size", [COMPRESS_OVER, COMPRESS_OVER + 1, 100_000])
def test_new_message_compresses_large_bodies(size: int) -> None:
    assert COMPRESS_OVER == 4096
    body = (b"evq-" * (size // 4 + 1))[:size]
    m = new_message("T", body)
    assert m.sysflag & sf.COMPRESSED
    assert m.body != body
    assert zlib.decompress(m.body) == body
    assert m.body[:1] == b"\x78"  # zlib header (deflate, 32K window), not raw deflate
    assert m.payload() == body


@pytest.mark.parametrize("size", [0, 1, COMPRESS_OVER - 1])
def test_new_message_keeps_small_bodies(size: int) -> None:
    body = b"x" * size
    m = new_message("T", body)
    assert m.sysflag == 0
    assert m.body == body
    assert m.payload() == body


@given(st.integers(COMPRESS_OVER, 3 * COMPRESS_OVER), st.binary(max_size=64), st.integers(0))
def test_compressed_payload_inflates_any_body(size: int, head: bytes, seed: int) -> None:
    # Drawing 4 KiB+ byte by byte trips Hypothesis' large-example health check; a drawn head
    # plus seeded pseudo-random (incompressible) bytes covers the same ground.
    body = head + Random(seed).randbytes(size - len(head))
    m = new_message("T", body)
    assert m.sysflag == sf.COMPRESSED
    assert m.payload() == body


def test_compression_threshold_is_configurable() -> None:
    body = b"y" * 10_000
    plain = new_message("T", body, compress_over=None)
    assert plain.sysflag == 0 and plain.body == body
    small = new_message("T", b"abc", compress_over=3)
    assert small.sysflag == sf.COMPRESSED and zlib.decompress(small.body) == b"abc"


def test_payload_without_compressed_bit_is_the_body() -> None:
    raw = zlib.compress(b"data")
    assert Message(topic="T", body=raw).payload() == raw
    assert Message(topic="T", body=raw, sysflag=sf.COMPRESSED).payload() == b"data"


@given(topics, bodies, tags, key_lists, properties, st.integers(-(2**31), 2**31 - 1))
@example("T", b"", "t", [], {"KEYS": "given", "TAGS": "replaced"}, 0)
@example("T", b"", "t", ["k"], {"KEYS": "replaced"}, 0)
def test_new_message_folds_tags_and_keys_into_properties(
    topic: str, body: bytes, tag: str, ks: list[str], props: dict[str, str], flag: int
) -> None:
    before = dict(props)
    m = new_message(topic, body, tags=tag, keys=ks, properties=props, flag=flag)
    assert m.topic == topic and m.flag == flag
    assert m.properties[Prop.TAGS] == tag
    assert m.tags == tag
    if ks:
        assert m.properties[Prop.KEYS] == " ".join(ks)
        assert m.keys == ks
    else:  # no keys argument: a KEYS property passed in stays
        assert m.keys == split_keys(props.get(Prop.KEYS))
    for name, value in props.items():
        if name not in (Prop.TAGS, Prop.KEYS) or (name == Prop.KEYS and not ks):
            assert m.properties[name] == value
    assert m.payload() == body
    assert props == before  # the caller's mapping is not mutated


def test_new_message_without_tags_or_keys() -> None:
    m = new_message("T", b"", tags="", keys=[])
    assert m.properties == {}
    assert m.tags is None
    assert m.keys == []
    assert m.index_keys() == ()


def test_new_message_accepts_keys_as_one_string() -> None:
    m = new_message("T", b"", keys="k1  k2 ")
    assert m.properties[Prop.KEYS] == "k1  k2 "
    assert m.keys == ["k1", "k2"]


def test_new_message_does_not_mutate_given_properties() -> None:
    props = {"a": "1"}
    m = new_message("T", b"", tags="t", properties=props)
    assert props == {"a": "1"}
    assert m.properties == {"a": "1", Prop.TAGS: "t"}


# --- accessors -------------------------------------------------------------------------------


def test_accessors_read_literal_property_names() -> None:
    m = Message(
        topic="T",
        properties={"TAGS": "TagA", "KEYS": " order-1  order-2 ", "UNIQ_KEY": "7F000001ABCD"},
    )
    assert m.tags == "TagA"
    assert m.keys == ["order-1", "order-2"]
    assert m.uniq_key == "7F000001ABCD"
    assert m.index_keys() == ("7F000001ABCD", "order-1", "order-2")


def test_accessors_on_a_bare_message() -> None:
    m = Message(topic="T")
    assert (m.tags, m.keys, m.uniq_key, m.index_keys()) == (None, [], None, ())


@given(keys, key_lists)
def test_index_keys_put_uniq_key_first(uniq: str, ks: list[str]) -> None:
    m = Message(topic="T", properties={Prop.UNIQ_KEY: uniq, Prop.KEYS: " ".join(ks)})
    assert m.index_keys() == (uniq, *ks)
    assert Message(topic="T", properties={Prop.KEYS: " ".join(ks)}).index_keys() == tuple(ks)


@given(key_lists)
def test_split_keys_inverts_join(ks: list[str]) -> None:
    assert split_keys(" ".join(ks)) == ks
    assert split_keys("  ".join(ks) + " ") == ks
    assert split_keys(None) == []
    assert split_keys("") == []


def test_body_crc_is_not_part_of_equality() -> None:
    assert Message(topic="T", body=b"x", body_crc=1) == Message(topic="T", body=b"x", body_crc=2)
    assert Message(topic="T", body=b"x") != Message(topic="T", body=b"y")


# --- hosts -----------------------------------------------------------------------------------


def test_host_bytes_are_address_and_four_byte_port() -> None:
    assert host_bytes(("127.0.0.1", 10911)) == bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])
    assert host_bytes(("::1", 1)) == bytes(15) + b"\x01" + b"\x00\x00\x00\x01"
    assert host_bytes(("1.2.3.4", 2**31 - 1)) == b"\x01\x02\x03\x04\x7f\xff\xff\xff"
    assert not is_ipv6(("1.2.3.4", 0))
    assert is_ipv6(("fe80::1", 0))
