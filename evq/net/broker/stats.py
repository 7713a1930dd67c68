"""What a broker counts as it serves: plain integers the request path bumps, and their rates.

The counters cost one attribute increment per request on the event loop (which owns them: no
lock), so they can run in production and feed RocketMQ's runtime figures now and a metrics
endpoint later.  Rates come from a snapshot of the counters taken once a second (RocketMQ's
``StoreStatsService`` samples the same way), kept for ten minutes: ``putTps`` is "the last
10 s, 60 s and 600 s" in one string, as RocketMQ prints it, each over what has been sampled so
far while the broker is younger than the window.  ``msgPutTotalTodayNow`` and
``msgGetTotalTodayNow`` count since the broker started, not since midnight.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import attrs

from evq.domain.clock import Clock

WINDOWS_S = (10, 60, 600)
"""RocketMQ's three TPS windows, in seconds."""
SAMPLE_EVERY_S = 1.0


@attrs.frozen(slots=True)
class Snapshot:
    at_ms: int
    put: int
    got: int
    found: int
    missed: int


@attrs.define(slots=True)
class BrokerStats:
    boot_ms: int
    messages_put: int = 0
    """Messages stored by sends (a batch counts each message)."""
    bytes_put: int = 0
    """Stored bytes of those messages (their records, as RocketMQ's ``putMessageSizeTotal``)."""
    messages_got: int = 0
    """Messages handed to consumers by pulls."""
    pulls_found: int = 0
    """Pulls answered with messages."""
    pulls_missed: int = 0
    """Pulls answered without (none new, offset moved, no such queue...)."""
    puts_refused: int = 0
    """Sends the store did not take as asked (refused, or not flushed or replicated in time)."""
    samples: collections.deque[Snapshot] = attrs.field(
        factory=lambda: collections.deque(maxlen=max(WINDOWS_S) + 1))

    def sample(self, now_ms: int) -> None:
        self.samples.append(Snapshot(now_ms, self.messages_put, self.messages_got,
                                     self.pulls_found, self.pulls_missed))

    async def sample_forever(self, clock: Clock) -> None:
        """Take a snapshot every second (a task on the broker's loop, which owns the
        counters)."""
        while True:
            self.sample(clock.now_ms())
            await asyncio.sleep(SAMPLE_EVERY_S)

    def _tps(self, count: Callable[[Snapshot], int]) -> str:
        """Per-second rates of ``count`` over each window, as RocketMQ's "a b c" string."""
        if len(self.samples) < 2:
            return " ".join("0.00" for _ in WINDOWS_S)
        last = self.samples[-1]
        rates = []
        for window in WINDOWS_S:
            first = self.samples[max(len(self.samples) - 1 - window, 0)]
            span_ms = max(last.at_ms - first.at_ms, 1)
            rates.append(f"{(count(last) - count(first)) * 1000 / span_ms:.2f}")
        return " ".join(rates)

    def runtime_fields(self, now_ms: int) -> dict[str, object]:
        """RocketMQ's runtime-info keys these counters answer."""
        up_s = max(now_ms - self.boot_ms, 0) // 1000
        days, rest = divmod(up_s, 86_400)
        hours, rest = divmod(rest, 3_600)
        minutes, seconds = divmod(rest, 60)
        return {
            "bootTimestamp": self.boot_ms,
            "runtime": f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]",
            "msgPutTotalTodayNow": self.messages_put,
            "msgGetTotalTodayNow": self.messages_got,
            "putMessageTimesTotal": self.messages_put,
            "putMessageSizeTotal": self.bytes_put,
            "putMessageAverageSize": f"{self.bytes_put / max(self.messages_put, 1):.2f}",
            "putTps": self._tps(lambda s: s.put),
            "getTransferedTps": self._tps(lambda s: s.got),
            "getFoundTps": self._tps(lambda s: s.found),
            "getMissTps": self._tps(lambda s: s.missed),
            "getTotalTps": self._tps(lambda s: s.found + s.missed),
            "evqSendsRefused": self.puts_refused,
        }
