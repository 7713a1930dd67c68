"""How long the event loop went without running: the figure that says whether some request
held it (see :mod:`evq.net.execution` for what may run there).

A task asks to wake every ``interval`` seconds and records how late it woke; a late wake-up
is a stretch in which no callback, and so no other connection, could run.  It costs one timer
a tick (100 a second by default), which is why the broker can keep it running in production
and report it (``evqLoopStallMaxMs`` in the runtime info), as a metrics surface will.
"""

from __future__ import annotations

import asyncio

import attrs


@attrs.define(slots=True)
class LoopLag:
    interval: float = 0.01
    max_stall: float = 0.0
    """The longest lateness seen, in seconds."""
    ticks: int = 0

    async def run(self) -> None:
        """Watch the running loop until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.record(loop.time() - asked)

    def record(self, late: float) -> None:
        self.ticks += 1
        if late > self.max_stall:
            self.max_stall = late
