"""What a server turns away at a bound (connections, a name server's table entries), counted and
logged without flooding the log.

A flood past a bound is what an attacker (or a client in a reconnect loop) makes: a warning a
refusal would let it fill the disk with log lines, so the first refusal of a stretch is logged
at once and later ones once an interval, each line with the count since the last.  Pure
bookkeeping, on the event loop of the server that owns it.
"""

from __future__ import annotations

from typing import Final

import attrs

from evq import logs
from evq.domain.clock import SYSTEM_CLOCK, Clock

LOG_INTERVAL_S: Final = 10.0
"""How often a stretch of refusals is logged: once, with its count, not a line each."""

log = logs.get_logger(__name__)


@attrs.define(slots=True)
class Refusals:
    """``event``: the warning's text; ``bound``: the limit it names, under ``setting``."""

    event: str
    bound: int
    clock: Clock = SYSTEM_CLOCK
    setting: str = attrs.field(default="max_connections", kw_only=True)
    """The bound's name in the warning (``max_connections``, ``maxBrokerAddresses``)."""
    count: int = 0
    """Refusals so far (what a metrics surface reads)."""
    _logged: int = 0  # count when a warning last said so
    _logged_at: float = -LOG_INTERVAL_S

    def refuse(self, **context: object) -> None:
        """Count one refusal, and log the stretch if the interval has passed."""
        self.count += 1
        now = self.clock.monotonic()
        if now - self._logged_at >= LOG_INTERVAL_S:
            log.warning(self.event, **{self.setting: self.bound},
                        refused=self.count - self._logged, **context)
            self._logged, self._logged_at = self.count, now
