"""Injected time.

Every timer in evq (flush intervals, expiry, delay levels, transaction checks, lock expiry,
heartbeats) reads a :class:`Clock`, so tests move time forward instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import attrs


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (store timestamps, expiry)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for intervals and timeouts."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    # time.monotonic itself, not a method calling it: read on every read and request of a
    # connection, a Python frame around it was one of the few dozen a request pays.
    monotonic = staticmethod(time.monotonic)


@attrs.define(slots=True)
class ManualClock:
    """A clock that moves only when told to; thread-safe."""

    ms: int = 1_700_000_000_000
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def now_ms(self) -> int:
        with self._lock:
            return self.ms

    def monotonic(self) -> float:
        with self._lock:
            return self.ms / 1000.0

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.ms += round(seconds * 1000)


SYSTEM_CLOCK: Clock = SystemClock()
