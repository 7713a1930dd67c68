"""How long the event loop went without running: the figure that says whether some request
held it (see :mod:`evq.net.execution` for what may run there).

A timer asks to run every ``interval`` seconds and records how late it ran; a late run is a
stretch in which no callback, and so no other connection, could run.  It costs one plain timer
callback a tick (100 a second by default), which is why the broker can keep it running in
production and report it (``evqLoopStallMaxMs`` in the runtime info), as a metrics surface
will.  The ticks are timer callbacks rather than a task sleeping in a loop, which made a
future and stepped a task each tick: an idle broker's loop thread spent 17 ms of CPU a second
with the task and 14 ms with the callbacks (most of either is waking up), and a loaded one
pays the difference in time taken from its requests.
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

        def tick(asked: float) -> None:
            nonlocal handle
            now = loop.time()
            self.record(now - asked)
            handle = loop.call_at(now + self.interval, tick, now + self.interval)

        start = loop.time() + self.interval
        handle: asyncio.TimerHandle = loop.call_at(start, tick, start)
        try:
            await loop.create_future()  # never set: the ticks run until this is cancelled
        finally:
            handle.cancel()

    def record(self, late: float) -> None:
        self.ticks += 1
        if late > self.max_stall:
            self.max_stall = late
