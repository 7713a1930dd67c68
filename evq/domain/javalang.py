"""Java library behaviours that RocketMQ's filters lean on and evq must reproduce exactly.

Subscriptions and SQL92 selectors are evaluated by Java code in a RocketMQ broker; a consumer
moving to evq must see the same messages, so the corner cases of ``String.trim``,
``Integer.valueOf``, ``Long.valueOf``, ``Double.valueOf``, ``Boolean.valueOf`` and
``Double.compare`` are kept here rather than approximated with Python's ``strip``, ``int``
and ``float`` (which accept underscores, Unicode spaces and lower-case ``nan``, and order
``-0.0`` equal to ``0.0``).
"""

from __future__ import annotations

import math
import re

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
_LONG_DIGITS = len(str(LONG_MAX))

# String.trim() removes every char up to and including U+0020 from both ends, nothing else.
_TRIMMED = "".join(map(chr, range(0x21)))

# FloatingDecimal.readJavaFormatString after trimming: ASCII digits only, optional type suffix.
_DOUBLE = re.compile(
    r"""[+-]?(?:
          NaN | Infinity
        | (?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?
        | 0[xX](?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?
    )""",
    re.VERBOSE,
)


class NumberFormatError(ValueError):
    """Text that Java's ``valueOf`` would reject with a ``NumberFormatException``."""


def java_trim(text: str) -> str:
    """``String.trim()``: strips control characters and spaces, but not Unicode spaces."""
    return text.strip(_TRIMMED)


def parse_int(text: str) -> int:
    """``Integer.valueOf(text)``: a signed 32-bit decimal, no spaces, no underscores."""
    return _parse_integer(text, INT_MIN, INT_MAX, "int")


def parse_long(text: str) -> int:
    """``Long.valueOf(text)``: a signed 64-bit decimal, no spaces, no underscores."""
    return _parse_integer(text, LONG_MIN, LONG_MAX, "long")


def _parse_integer(text: str, low: int, high: int, name: str) -> int:
    # Integer.parseInt: optional sign, then Character.digit(c, 10) digits, i.e. Unicode Nd
    # characters (str.isdecimal) of the BMP: a supplementary digit is two UTF-16 chars to
    # Java, neither of them a digit.  int() would also take blanks and underscores.
    sign = text[:1] if text[:1] in ("+", "-") else ""
    digits = text[len(sign) :]
    if not digits.isdecimal() or (not digits.isascii() and max(digits) > "\uffff"):
        raise NumberFormatError(f"{text[:40]!r} is not a Java {name}")
    if len(digits) > _LONG_DIGITS:
        # Java reads any number of leading zeros; int() refuses over 4300 digits at all.
        digits = "".join(str(int(c)) for c in digits).lstrip("0") or "0"
    value = int(sign + digits) if len(digits) <= _LONG_DIGITS else high + 1
    if not low <= value <= high:
        raise NumberFormatError(f"{text[:40]!r} is out of range for a Java {name}")
    return value


def parse_double(text: str) -> float:
    """``Double.valueOf(text)``, overflow to infinity included."""
    body = java_trim(text)
    if _DOUBLE.fullmatch(body) is None:
        raise NumberFormatError(f"{text[:40]!r} is not a Java double")
    if body[-1] in "fFdD":
        body = body[:-1]
    if "x" not in body and "X" not in body:
        return float(body)
    try:
        return float.fromhex(body)
    except OverflowError:  # Java rounds an oversized hex float to infinity
        return -math.inf if body.startswith("-") else math.inf


def parse_boolean(text: str) -> bool:
    """``Boolean.valueOf(text)``: true for any casing of ``true``, false for anything else."""
    return text.isascii() and text.lower() == "true"


def compare_doubles(a: float, b: float) -> int:
    """``Double.compare``: a total order where ``-0.0 < 0.0`` and NaN is above everything and
    equal to itself (``Double.equals`` agrees with it)."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a != 0.0:
            return 0
        sign_a, sign_b = math.copysign(1.0, a), math.copysign(1.0, b)
        return (sign_a > sign_b) - (sign_a < sign_b)
    a_nan, b_nan = math.isnan(a), math.isnan(b)
    return a_nan - b_nan
