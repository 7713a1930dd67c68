"""mqadmin's timestamp arguments: epoch milliseconds, ``now``, or local
``yyyy-MM-dd#HH:mm:ss:SSS`` (the form ``resetOffsetByTime -s`` documents)."""

from __future__ import annotations

import datetime as dt
import re

_LOCAL = re.compile(r"^(\d{4})-(\d{2})-(\d{2})#(\d{2}):(\d{2}):(\d{2}):(\d{3})$")


def parse_timestamp(text: str, now_ms: int) -> int:
    """Epoch milliseconds of ``text``; ValueError naming the accepted forms otherwise."""
    text = text.strip()
    if text == "now":
        return now_ms
    if text.lstrip("-").isdigit():
        return int(text)
    m = _LOCAL.match(text)
    if m is None:
        raise ValueError(f"timestamp {text!r} is neither epoch milliseconds, 'now', nor "
                         "yyyy-MM-dd#HH:mm:ss:SSS")
    y, mo, d, h, mi, s, ms = (int(g) for g in m.groups())
    try:
        local = dt.datetime(y, mo, d, h, mi, s, ms * 1000).astimezone()
    except ValueError as exc:
        raise ValueError(f"timestamp {text!r}: {exc}") from None
    return round(local.timestamp() * 1000)


def format_timestamp(ms: int) -> str:
    """The inverse, for tables (0 and negatives print as ``-``)."""
    if ms <= 0:
        return "-"
    t = dt.datetime.fromtimestamp(ms / 1000).astimezone()
    return t.strftime("%Y-%m-%d#%H:%M:%S:") + f"{ms % 1000:03d}"
