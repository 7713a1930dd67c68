"""The CRC-32 every record body, HA log window and registration body is checked with
(:mod:`evq.domain.checksum`): zlib-ng's where installed, and then it must answer what zlib
answers, for any bytes and any running value."""

from __future__ import annotations

import importlib.util
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain import checksum


@given(st.binary(max_size=70_000), st.integers(0, 2**32 - 1))
def test_answers_what_zlib_answers(data: bytes, value: int) -> None:
    assert checksum.crc32(data, value) == zlib.crc32(data, value)
    assert checksum.crc32(memoryview(data)) == zlib.crc32(data)


@given(st.lists(st.binary(max_size=9_000), max_size=6))
def test_a_running_value_over_pieces_is_the_whole_ones(pieces: list[bytes]) -> None:
    """How the HA handshake checks a window read in chunks."""
    value = 0
    for piece in pieces:
        value = checksum.crc32(piece, value)
    assert value == zlib.crc32(b"".join(pieces))


@pytest.mark.skipif(importlib.util.find_spec("zlib_ng") is None,
                    reason="zlib-ng is not installed: zlib's CRC is expected")
def test_zlib_ngs_crc_is_the_one_in_use_where_installed() -> None:
    from zlib_ng import zlib_ng

    assert checksum.crc32 is zlib_ng.crc32
