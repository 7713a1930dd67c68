"""What a broker counts as it serves: plain integers the request path bumps.

The counters cost one attribute increment per request on the event loop (which owns them: no
lock), so they can run in production and feed RocketMQ's runtime figures now and a metrics
endpoint later.  ``msgPutTotalTodayNow`` and ``msgGetTotalTodayNow`` count since the broker
started, not since midnight.
"""

from __future__ import annotations

import attrs


@attrs.define(slots=True)
class BrokerStats:
    boot_ms: int
    messages_put: int = 0
    """Messages stored by sends (a batch counts each message)."""
    messages_got: int = 0
    """Messages handed to consumers by pulls."""
    puts_refused: int = 0
    """Sends the store did not take as asked (refused, or not flushed or replicated in time)."""

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
            "evqSendsRefused": self.puts_refused,
        }
