"""zlib inflation with a bound: what a peer's compressed bytes may cost this process.

A zlib stream inflates up to ~1000x, so a 16 MiB frame can ask for 16 GiB: every inflate of
bytes from outside goes through :func:`inflate`, which stops at ``limit`` inflated bytes
instead of allocating what the stream asks for.
"""

from __future__ import annotations

import zlib


class InflateError(ValueError):
    """The bytes are not one whole zlib stream, or inflate past the limit."""


def inflate(data: bytes | memoryview, limit: int) -> bytes:
    """``data`` inflated; raises :class:`InflateError` past ``limit`` bytes, for a damaged
    stream, or for one with bytes after its end.  Memory held stays under about twice
    ``limit`` (zlib grows its output buffer by doubling up to ``limit + 1``)."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InflateError(f"not a zlib stream: {exc}") from None
    if len(out) > limit:
        raise InflateError(f"inflates past {limit} bytes")
    if not inflater.eof:
        raise InflateError("the compressed stream is truncated")
    if inflater.unused_data:
        raise InflateError(f"{len(inflater.unused_data)} bytes follow the compressed stream")
    return out
