"""Java ``String.hashCode`` as evq computes it (evq.domain.hashing; doc §3.6, §4.4)."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from evq.domain.hashing import (
    index_key_hash,
    index_topic_seed,
    java_hash,
    java_hash_unsigned,
    tags_code,
)
from tests.strategies import keys, tags, topics

INT_MIN = -(2**31)
UTF8_TEXT = st.characters(codec="utf-8")


def reference_hash(s: str) -> int:
    """Java's loop, written out plainly: ``h = 31*h + c`` over UTF-16 code units, signed."""
    raw = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(raw), 2):
        unit = (raw[i] << 8) | raw[i + 1]
        h = (31 * h + unit) % 2**32
    return h - 2**32 if h >= 2**31 else h


def with_hash(prefix: str, target: int) -> str:
    """``prefix`` plus five CJK characters chosen so the whole string hashes to ``target``.

    hash(prefix + x0..x4) = hash(prefix)*31**5 + sum(x_i * 31**(4-i)) (mod 2**32).  Each x_i is
    0x4E00 + d_i; the digits d_i are the greedy base-31 expansion of what is left, so d_0 stays
    below 2**32 // 31**4 = 4650 and the others below 31: every character is a CJK ideograph.
    """
    base = 0x4E00
    offset = sum(base * 31**k for k in range(5))
    need = (target - reference_hash(prefix) * 31**5 - offset) % 2**32
    digits = []
    for k in range(4, -1, -1):
        d, need = divmod(need, 31**k)
        digits.append(d)
    return prefix + "".join(chr(base + d) for d in digits)


# --- java_hash -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("abc", 96354),
        ("Aa", 2112),
        ("BB", 2112),  # the classic collision
        ("polygenelubricants", INT_MIN),  # the classic Integer.MIN_VALUE string
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # one code point, two UTF-16 units
    ],
)
def test_java_hash_known_values(text: str, expected: int) -> None:
    assert java_hash(text) == expected
    assert reference_hash(text) == expected
    assert java_hash_unsigned(text) == expected % 2**32


def test_reference_matches_java_for_non_bmp() -> None:
    # "a😀" = 'a', 0xD83D, 0xDE00 in Java.
    assert reference_hash("a\U0001f600") == (97 * 31 * 31 + 0xD83D * 31 + 0xDE00)


@given(st.text(UTF8_TEXT, max_size=600))
@example("x" * 511)
@example("x" * 512)
@example("x" * 513)
@example("x" * 5000)
@example("é" * 512)
@example("é" * 513)
@example("\U0001f600" * 256)  # 512 code units
@example("a" + "\U0001f600" * 256)  # 513 code units
@example("\U0001f600" * 300)  # 600 code units, 300 characters
def test_java_hash_matches_reference(text: str) -> None:
    h = java_hash(text)
    assert h == reference_hash(text)
    assert INT_MIN <= h < 2**31
    assert java_hash_unsigned(text) == h % 2**32


@given(st.text(UTF8_TEXT, min_size=480, max_size=1200))
def test_java_hash_matches_reference_around_the_table_length(text: str) -> None:
    assert java_hash(text) == reference_hash(text)


@given(st.text(st.characters(min_codepoint=0x10000, codec="utf-8"), min_size=1, max_size=400))
def test_java_hash_non_bmp_uses_surrogate_pairs(text: str) -> None:
    assert java_hash(text) == reference_hash(text)


@pytest.mark.parametrize("target", [INT_MIN, -1, 0, 1, 2**31 - 1, -123456789])
def test_java_hash_of_constructed_strings(target: int) -> None:
    s = with_hash("TopicTest#key", target)
    assert reference_hash(s) == target
    assert java_hash(s) == target
    assert java_hash_unsigned(s) == target % 2**32


def test_java_hash_integer_min_value_tags_code() -> None:
    # A TAGS value hashing to Integer.MIN_VALUE is stored as is (sign-extended), not negated.
    s = with_hash("tag-", INT_MIN)
    assert tags_code(s) == INT_MIN
    assert tags_code("polygenelubricants") == INT_MIN


# --- tags_code -------------------------------------------------------------------------------


def test_tags_code_of_no_tag_is_zero() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0


def test_tags_code_known_values() -> None:
    assert tags_code("TagA") == reference_hash("TagA")
    assert tags_code("null") == 3392903  # ali-ons' "no tag" literal (doc §3.4)
    assert tags_code("a||b") == reference_hash("a||b")  # the whole value, even for MULTI_TAG


@given(tags)
def test_tags_code_is_java_hash_of_the_whole_value(tag: str) -> None:
    assert tags_code(tag) == reference_hash(tag)


# --- index_key_hash --------------------------------------------------------------------------
# evq departs from RocketMQ here on purpose (see index_key_hash's docstring): the IndexFile is
# private to the store, so the key hash is CRC-32 of "topic#key" (UTF-8) masked to 31 bits
# instead of abs(("topic#key").hashCode()).


def reference_index_key_hash(topic: str, key: str) -> int:
    return zlib.crc32(f"{topic}#{key}".encode()) & 0x7FFFFFFF


@given(topics | st.text(UTF8_TEXT, min_size=1, max_size=40), keys)
@example("TopicTest", "k")
@example("主题", "ключ")
def test_index_key_hash_is_masked_crc32_of_topic_hash_key(topic: str, key: str) -> None:
    h = index_key_hash(topic, key)
    assert 0 <= h <= 0x7FFFFFFF
    assert h == reference_index_key_hash(topic, key)
    # The append path continues the CRC from the cached per-topic seed: same value.
    assert zlib.crc32(key.encode(), index_topic_seed(topic)) & 0x7FFFFFFF == h


def test_index_key_hash_known_value() -> None:
    # CRC-32 of b"a#b" is 0xAB410F10; masking drops the top bit.
    assert zlib.crc32(b"a#b") == 0xAB410F10
    assert index_key_hash("a", "b") == 0x2B410F10
    assert index_topic_seed("a") == zlib.crc32(b"a#")


def test_index_key_hash_splits_nowhere_but_the_joined_string() -> None:
    # Only "topic#key" is hashed, so the same joined string gives the same slot.
    assert index_key_hash("a#b", "c") == index_key_hash("a", "b#c")
    assert index_key_hash("a", "bc") != index_key_hash("ab", "c")
