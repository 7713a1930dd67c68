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

import attrs

_counters = itertools.count()
"""Every key's counter (the low 16 bits of the next number): ``next`` on it is one C call,
which no other thread can interleave with, so no lock is taken (one cost three times the rest
of a key)."""
_HEX = [f"{n:02X}" for n in range(256)]  # a counter's two bytes: three times faster than format
_prefix_cache: dict[str, str] = {}  # ip -> the key's first 12 hex digits (ip, pid, random)
_Head = tuple[int, str, str, str, int, int]
"""The last key's head and what it was made of: (ms, ip, head, the ip's prefix, and the
``[start, end)`` of its month in epoch ms)."""
_NO_HEAD: _Head = (-1, "", "", "", 0, -1)
_last_head = _NO_HEAD  # see _head


def _forget_prefixes() -> None:
    global _last_head
    _prefix_cache.clear()
    _last_head = _NO_HEAD


# A forked child gets prefixes of its own (its pid is in them): the caches start empty there.
os.register_at_fork(after_in_child=_forget_prefixes)


def _prefix(ip: str) -> str:
    prefix = _prefix_cache.get(ip)
    if prefix is None:
        parts = bytes(int(p) for p in ip.split(".")) if ip.count(".") == 3 else b"\x7f\0\0\1"
        prefix = _prefix_cache[ip] = (parts + (os.getpid() & 0xFFFF).to_bytes(2, "big")
                                      + secrets.token_bytes(4)).hex().upper()
    return prefix


def _month_of(now_ms: int) -> tuple[int, int]:
    """``[start, end)`` in epoch ms of the (UTC) month holding ``now_ms``: keys count ms since
    the month began."""
    first = dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (first + dt.timedelta(days=32)).replace(day=1)
    return int(first.timestamp() * 1000), int(following.timestamp() * 1000)


def new_uniq_key(now_ms: int, ip: str = "127.0.0.1") -> str:
    """One key for a message made at ``now_ms`` (a producer's every single send): what
    :func:`new_uniq_keys` makes, without its list.

    The last head is reused here and the counter formatted here (:func:`_counter_hex`,
    inlined): a sync send waits on every microsecond of its client's CPU, and the two frames
    cost more than their work when the millisecond has not moved on."""
    n = next(_counters)
    last = _last_head  # one tuple read: another thread may replace it, never half of it
    head = last[2] if last[0] == now_ms and last[1] == ip else _head(now_ms, ip)
    return head + _HEX[n >> 8 & 0xFF] + _HEX[n & 0xFF]


def new_uniq_keys(now_ms: int, count: int, ip: str = "127.0.0.1") -> list[str]:
    """``count`` keys for messages made at ``now_ms`` (see :class:`UniqKeyRun`)."""
    return new_uniq_key_run(now_ms, count, ip).as_list()


@attrs.frozen(slots=True)
class UniqKeyRun:
    """Keys made together: the first 28 hex digits are the same for all of them (formatted
    once), the counters run on from ``first``.  The compiled send path formats each key
    itself (``keyed_records`` in evq/domain/record_kernels.pyx, checked against
    :meth:`as_list`), without a str per key in between."""

    head: str
    first: int
    count: int

    def as_list(self) -> list[str]:
        head = self.head
        return [head + _counter_hex(n) for n in range(self.first, self.first + self.count)]


def new_uniq_key_run(now_ms: int, count: int, ip: str = "127.0.0.1") -> UniqKeyRun:
    """``count`` keys for messages made at ``now_ms``, as a :class:`UniqKeyRun`."""
    head = _head(now_ms, ip)
    if count <= 0:
        return UniqKeyRun(head, 0, 0)
    # The counters of the run are taken in one C call (islice steps the count in C), so no
    # other thread takes one in between: they are consecutive.
    last = next(itertools.islice(_counters, count - 1, None))
    return UniqKeyRun(head, last - count + 1, count)


def _counter_hex(n: int) -> str:
    """The low 16 bits of ``n`` (counters wrap there), as four hex digits."""
    return _HEX[n >> 8 & 0xFF] + _HEX[n & 0xFF]


def _head(now_ms: int, ip: str) -> str:
    """The 28 hex digits before the counter: the same for every key made in one millisecond,
    and one producer makes dozens a millisecond, so the last is kept, and with it the prefix
    and the month it was made of: a new millisecond formats only the time's eight digits
    (working the month out through ``datetime`` cost more than the rest of a key)."""
    global _last_head
    # One tuple: another thread may replace it whole, never half of it.
    last_ms, last_ip, head, prefix, start, end = _last_head
    if last_ms == now_ms and last_ip == ip:
        return head
    if last_ip != ip or not prefix:  # (no prefix: the first key, or the first since a fork)
        prefix = _prefix(ip)
    if not start <= now_ms < end:
        start, end = _month_of(now_ms)
    head = f"{prefix}{(now_ms - start) & 0xFFFFFFFF:08X}"
    _last_head = (now_ms, ip, head, prefix, start, end)
    return head
