"""The bytes of requests a server holds for all its connections together.

Each connection bounds its own (a frame, the requests its handlers hold: ``TransportConfig``);
this bounds their sum, which 10,000 connections could otherwise take to hundreds of GiB:
frames still arriving, and requests that handlers hold.  A connection that ends a read with
bytes in its decoder while the total is past the bound stops being read (the rest of its frame
waits in the kernel's buffers, and the peer's sends stall) until the total falls to half the
bound; it still takes the whole frames it has.  Connections whose reads end on a frame's end
go on: a client of small requests is served while large ones wait.  A connection left waiting
goes idle, and the server's idle sweep closes it: that is how frames that never complete give
their room back.

Runs on the event loop of the server that owns it, as its connections do.
"""

from __future__ import annotations

from typing import Protocol

import attrs


class Waiter(Protocol):
    def budget_resumed(self) -> None:
        """The budget has room again: read if nothing else stops it."""


@attrs.define(slots=True, eq=False)
class ReadBudget:
    limit: int
    used: int = 0
    """Bytes held now: in connections' decoders, and by their running handlers."""
    waiting: set[Waiter] = attrs.field(factory=set)
    """Connections not read for want of room."""
    waits: int = 0
    """Times a connection was made to wait (a counter a metrics surface reads)."""

    def change(self, delta: int) -> None:
        """``delta`` bytes more (or fewer) held; at half the bound, the waiting read again."""
        self.used += delta
        if delta < 0 and self.waiting and self.used <= self.limit // 2:
            waiting, self.waiting = self.waiting, set()
            for conn in waiting:
                conn.budget_resumed()

    def should_wait(self, conn: Waiter, holding: int) -> bool:
        """Whether ``conn``, holding ``holding`` bytes at the end of a read, must stop reading;
        if so it is among :attr:`waiting` until :meth:`change` makes room."""
        if not holding or self.used <= self.limit:
            return False
        self.waiting.add(conn)
        self.waits += 1
        return True

    def forget(self, conn: Waiter, holding: int) -> None:
        """``conn`` is gone, with the ``holding`` bytes its decoder had."""
        self.waiting.discard(conn)
        self.change(-holding)
