"""Java's conversions as evq reproduces them (evq.domain.javalang); expected values are what
the JDK answers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.javalang import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    NumberFormatError,
    compare_doubles,
    java_trim,
    parse_boolean,
    parse_double,
    parse_int,
    parse_long,
)


def test_java_trim_strips_controls_and_spaces_only() -> None:
    assert java_trim("\x00\t a b \x1f\x20") == "a b"
    assert java_trim("\u00a0a\u2003") == "\u00a0a\u2003"  # Unicode spaces stay, unlike str.strip
    assert java_trim(" \x7f ") == "\x7f"  # DEL is above U+0020
    assert java_trim("   ") == ""


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("-0", 0), ("+7", 7), ("-2147483648", INT_MIN), ("2147483647", INT_MAX),
     ("007", 7), ("\u0663\u0664", 34)],  # Arabic-Indic digits: Character.digit accepts them
)
def test_parse_int_accepts(text: str, value: int) -> None:
    assert parse_int(text) == value
    assert parse_long(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "+", "-", " 5", "5 ", "1_000", "5L", "1.0", "1e3", "0x10", "2147483648", "-2147483649",
     "\U0001d7ce"],  # a supplementary-plane digit is two UTF-16 chars to Java, not a digit
)
def test_parse_int_rejects(text: str) -> None:
    with pytest.raises(NumberFormatError):
        parse_int(text)


def test_parse_long_range() -> None:
    assert parse_long("2147483648") == 2**31
    assert parse_long("-9223372036854775808") == LONG_MIN
    assert parse_long("9223372036854775807") == LONG_MAX
    for text in ("9223372036854775808", "-9223372036854775809", "1 "):
        with pytest.raises(NumberFormatError):
            parse_long(text)


def test_integers_beyond_pythons_digit_limit() -> None:
    # int() refuses strings over 4300 digits with a plain ValueError; Java reads leading
    # zeros to any length and calls everything else out of range.
    assert parse_int("0" * 5000 + "42") == 42
    assert parse_long("-" + "0" * 5000 + "9223372036854775808") == LONG_MIN
    assert parse_int("\u0660" * 5000 + "7") == 7  # Arabic-Indic zeros count as zeros too
    for text in ("1" * 5000, "-" + "9" * 5000, "1" + "0" * 19):
        with pytest.raises(NumberFormatError, match="out of range"):
            parse_long(text)
    assert parse_double("1" * 5000) == math.inf


@given(st.integers(LONG_MIN, LONG_MAX))
def test_parse_long_reads_every_long(value: int) -> None:
    assert parse_long(str(value)) == value
    assert parse_long(f"+{value}" if value >= 0 else str(value)) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.5", 1.5), (" 2.5\t", 2.5), ("1.", 1.0), (".5", 0.5), ("1e3", 1000.0), ("1E-2", 0.01),
     ("1.5f", 1.5), ("2d", 2.0), ("-3D", -3.0), ("+4", 4.0), ("0x1p3", 8.0), ("0x.8P1", 1.0),
     ("-0X1.8p1d", -3.0), ("1e400", math.inf), ("-1e400", -math.inf), ("0x1p99999", math.inf),
     ("-0x1p99999", -math.inf), ("Infinity", math.inf), ("-Infinity", -math.inf),
     ("1e-400", 0.0)],
)
def test_parse_double_accepts(text: str, value: float) -> None:
    assert parse_double(text) == value


def test_parse_double_nan_and_signed_zero() -> None:
    assert math.isnan(parse_double("NaN"))
    assert math.isnan(parse_double("-NaN"))
    assert math.copysign(1.0, parse_double("-0.0")) == -1.0


@pytest.mark.parametrize(
    "text",
    ["", " ", ".", "e5", "1e", "1e+", "nan", "inf", "infinity", "1_0", "1.5ff", "0x1", "0x1.8",
     "\u0663", "1.5 f", "NaNd", "\u00a01"],
)
def test_parse_double_rejects(text: str) -> None:
    with pytest.raises(NumberFormatError):
        parse_double(text)


@given(st.floats(allow_nan=False))
def test_parse_double_reads_python_reprs(value: float) -> None:
    # repr() spells inf as "inf", which Java does not read; Java's own spelling is tested above.
    if math.isinf(value):
        return
    assert compare_doubles(parse_double(repr(value)), value) == 0


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("TRUE", True), ("tRuE", True), ("false", False), ("yes", False),
     ("1", False), (" true", False), ("", False), ("\uff54rue", False)],
)
def test_parse_boolean(text: str, value: bool) -> None:
    assert parse_boolean(text) is value


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [(1.0, 2.0, -1), (2.0, 1.0, 1), (1.0, 1.0, 0), (-0.0, 0.0, -1), (0.0, -0.0, 1),
     (0.0, 0.0, 0), (-0.0, -0.0, 0), (math.nan, math.inf, 1), (math.inf, math.nan, -1),
     (math.nan, math.nan, 0), (-math.inf, math.nan, -1)],
)
def test_compare_doubles_is_javas_total_order(a: float, b: float, expected: int) -> None:
    assert compare_doubles(a, b) == expected


@given(st.floats(allow_nan=False), st.floats(allow_nan=False))
def test_compare_doubles_agrees_with_ordinary_order_off_zero(a: float, b: float) -> None:
    if a == b == 0.0:
        return
    assert compare_doubles(a, b) == (a > b) - (a < b)
    assert compare_doubles(b, a) == -compare_doubles(a, b)
