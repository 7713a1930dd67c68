"""UNIQ_KEY message ids, shaped as RocketMQ's ``MessageClientIDSetter`` makes them.

    +--------+------+-----------+----------------------+---------+
    | ip (4) | pid  | random (4)| ms since month start | counter |
    |        | (2)  |           | (4)                  | (2)     |
    +--------+------+-----------+----------------------+---------+   = 32 hex characters

Tools that parse the id (for the producer address or time) read the same fields; the random
part stands where Java puts a class-loader hash, so two processes with one pid (containers)
still differ.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import secrets
import threading

_counter = itertools.count()
_lock = threading.Lock()
_prefix_cache: dict[tuple[str, int], bytes] = {}


def _prefix(ip: str) -> bytes:
    pid = os.getpid()  # re-read so a forked child does not reuse its parent's prefix
    key = (ip, pid)
    if key not in _prefix_cache:
        parts = bytes(int(p) for p in ip.split(".")) if ip.count(".") == 3 else b"\x7f\0\0\1"
        _prefix_cache[key] = parts + (pid & 0xFFFF).to_bytes(2, "big") + secrets.token_bytes(4)
    return _prefix_cache[key]


def new_uniq_key(now_ms: int, ip: str = "127.0.0.1") -> str:
    start = dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0)
    since = (now_ms - int(start.timestamp() * 1000)) & 0xFFFFFFFF
    with _lock:
        n = next(_counter) & 0xFFFF
    return (_prefix(ip) + since.to_bytes(4, "big") + n.to_bytes(2, "big")).hex().upper()
