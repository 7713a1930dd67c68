"""Which broker of a broker group (master or a slave) a consumer talks to.

Seed 000: a pull answer's ``suggestWhichBrokerId`` says where the *next* pull of that queue
should go (a slave when the consumer is far behind and the broker allows slave reads); offsets
are committed to the master, or to any live node of the group when the master is down.  A
broker that failed at the transport level counts as down for :data:`DOWN_FOR_S` seconds, so a
dead master costs one failed request, not one per pull, until the routes catch up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from evq.domain.clock import SYSTEM_CLOCK, Clock
from evq.domain.queues import MessageQueue
from evq.net.routes import MASTER_ID

DOWN_FOR_S: Final = 5.0


class BrokerChoice:
    """Per-queue suggestions and recently failed addresses; pure, given the clock.

    Shared by a consumer's event loop and, for a
    :class:`~evq.client.blocking.SyncPullConsumer`, its callers' threads: every read and
    write is one step on a dict, so none sees the other's half done."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, down_for_s: float = DOWN_FOR_S) -> None:
        self._clock = clock
        self._down_for_s = down_for_s
        self._suggested: dict[MessageQueue, int] = {}
        self._down_until: dict[str, float] = {}

    def suggest(self, queue: MessageQueue, broker_id: int) -> None:
        """Remember a pull answer's suggestion for the queue's next pull."""
        if broker_id == MASTER_ID:
            self._suggested.pop(queue, None)
        else:
            self._suggested[queue] = broker_id

    def failed(self, addr: str) -> None:
        self._down_until[addr] = self._clock.monotonic() + self._down_for_s

    def _up(self, addr: str) -> bool:
        until = self._down_until.get(addr)
        if until is None:
            return True
        if self._clock.monotonic() >= until:
            self._down_until.pop(addr, None)  # (a caller's thread may have just done so)
            return True
        return False

    def pull_target(self, queue: MessageQueue, addrs: Mapping[int, str]
                    ) -> tuple[int, str] | None:
        """``(broker id, address)`` for the queue's next pull: the suggested id, else the
        master, else any slave, skipping brokers that just failed (unless all did)."""
        wanted = self._suggested.get(queue, MASTER_ID)
        order = sorted(addrs, key=lambda i: (i != wanted, i != MASTER_ID, i))
        for broker_id in order:
            if self._up(addrs[broker_id]):
                return broker_id, addrs[broker_id]
        return (order[0], addrs[order[0]]) if order else None

    def offset_target(self, addrs: Mapping[int, str]) -> str | None:
        """Where offsets go: the master while it is up, else a live slave."""
        order = sorted(addrs)
        for broker_id in order:
            if self._up(addrs[broker_id]):
                return addrs[broker_id]
        return addrs[order[0]] if order else None
