"""Bounded inflation: a zlib bomb costs at most the limit, never what the stream asks for."""

from __future__ import annotations

import tracemalloc
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.domain.compression import InflateError, inflate

MIB = 1024 * 1024


def bomb(inflated: int) -> bytes:
    """A zlib stream of ``inflated`` zero bytes, about a thousandth of that on the wire."""
    deflater = zlib.compressobj(9)
    chunk = bytes(MIB)
    parts = [deflater.compress(chunk) for _ in range(inflated // MIB)]
    return b"".join(parts) + deflater.flush()


@given(st.binary(max_size=4096), st.integers(0, 8192))
def test_inflate_returns_the_data_or_refuses_past_the_limit(data: bytes, limit: int) -> None:
    packed = zlib.compress(data)
    if len(data) <= limit:
        assert inflate(packed, limit) == data
    else:
        with pytest.raises(InflateError, match=f"past {limit} bytes"):
            inflate(packed, limit)


def test_a_bomb_is_refused_holding_no_more_than_the_limit() -> None:
    packed = bomb(256 * MIB)
    assert len(packed) < MIB
    tracemalloc.start()
    try:
        with pytest.raises(InflateError):
            inflate(packed, 4 * MIB)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * MIB  # zlib grows its output buffer by doubling: about 2x the limit


@pytest.mark.parametrize(("packed", "reason"), [
    (b"not zlib", "not a zlib stream"),
    (zlib.compress(b"abc" * 100)[:-3], "truncated"),
    (zlib.compress(b"abc") + b"tail", "4 bytes follow"),
])
def test_damaged_streams_are_refused(packed: bytes, reason: str) -> None:
    with pytest.raises(InflateError, match=reason):
        inflate(packed, MIB)
