"""The test messages both sides of the interop tests build, free of the C++ library so the
pytest process can import it."""

from __future__ import annotations

BIG = 5000  # bytes: clients compress bodies over 4 KiB


def body_of(i: int) -> bytes:
    text = f"msg {i} ünïcødé 消息"
    return (text * (BIG // len(text) + 1)).encode() if i % 5 == 0 else text.encode()
