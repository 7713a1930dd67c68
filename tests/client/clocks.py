"""Clocks for client tests that need a send to look slow without making it slow."""

from __future__ import annotations

import time

from evq.domain.clock import SystemClock


class SlowAnswers(SystemClock):
    """The system clock, but while ``slow`` each monotonic read is 0.6 s past the last: a
    send timed by it took at least 600 ms, which the fault table skips a broker for (30 s)."""

    def __init__(self) -> None:
        self.slow = False
        self._extra = 0.0

    def monotonic(self) -> float:  # type: ignore[override]
        if self.slow:
            self._extra += 0.6
        return time.monotonic() + self._extra
