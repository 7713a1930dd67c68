"""Delay levels (RocketMQ ``messageDelayLevel``) and the arithmetic of due times."""

from __future__ import annotations

import re

import attrs

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)([smhd])$")


@attrs.frozen(slots=True)
class DelayLevels:
    """Level n (1-based) waits ``delays_ms[n - 1]``; SCHEDULE_TOPIC_XXXX queue n - 1 holds it."""

    delays_ms: tuple[int, ...]

    @classmethod
    def parse(cls, text: str = DEFAULT_DELAY_LEVELS) -> DelayLevels:
        delays = []
        for word in text.split():
            m = _LEVEL.match(word)
            if not m:
                raise ValueError(f"delay level {word!r} is not a number followed by s, m, h or d")
            delays.append(int(m[1]) * _UNITS_MS[m[2]])
        if not delays:
            raise ValueError("messageDelayLevel names no level")
        return cls(tuple(delays))

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    def clamp(self, level: int) -> int:
        """Levels above the last are the last, as RocketMQ does."""
        return min(level, self.max_level)

    def delay_ms(self, level: int) -> int:
        return self.delays_ms[self.clamp(level) - 1]

    def queue_of(self, level: int) -> int:
        return self.clamp(level) - 1

    def level_of_queue(self, queue_id: int) -> int:
        return queue_id + 1
