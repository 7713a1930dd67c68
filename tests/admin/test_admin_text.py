"""The pure parts of ``evq admin``: timestamp arguments and table layout."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.admin.render import table
from evq.admin.timestamps import format_timestamp, parse_timestamp

NOW = 1_790_000_000_000


@given(st.integers(1, 4_000_000_000_000))
def test_a_formatted_time_reads_back_as_the_same_millisecond(ms: int) -> None:
    text = format_timestamp(ms)
    try:
        assert parse_timestamp(text, NOW) == ms
    except AssertionError:  # a local time that happens twice (end of daylight saving)
        assert abs(parse_timestamp(text, NOW) - ms) == 3_600_000


@pytest.mark.parametrize("text, expected", [("now", NOW), ("0", 0), (" 1234 ", 1234)])
def test_epoch_milliseconds_and_now(text: str, expected: int) -> None:
    assert parse_timestamp(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "2026-13-01#00:00:00:000",
                                  "2026-01-01 00:00:00", "2026-01-01#00:00:00"])
def test_other_text_is_refused_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="timestamp"):
        parse_timestamp(text, NOW)


def test_columns_align_and_numbers_sit_right() -> None:
    out = table([{"name": "a", "n": 5, "tags": ["x", "y"]},
                 {"name": "longer", "n": 123, "tags": None}], ["name", "n", "tags"])
    assert out.splitlines() == [
        "name      n  tags",
        "a         5  x,y",
        "longer  123  -",
    ]
