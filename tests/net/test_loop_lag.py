"""The loop-stall monitor sees a loop held by blocking work."""

from __future__ import annotations

import asyncio
import time

from evq.net.loop_lag import LoopLag
from tests.net.harness import eventually


async def test_a_blocked_loop_is_measured_at_least_as_long_as_it_was_held() -> None:
    lag = LoopLag(interval=0.005)
    watcher = asyncio.create_task(lag.run())
    try:
        await eventually(lambda: lag.ticks >= 2)
        time.sleep(0.2)  # holds the loop, as a disk wait on it would
        ticks = lag.ticks
        await eventually(lambda: lag.ticks > ticks)
        assert lag.max_stall >= 0.19
    finally:
        watcher.cancel()


async def test_a_cancelled_watcher_leaves_no_tick_behind() -> None:
    lag = LoopLag(interval=0.002)
    watcher = asyncio.create_task(lag.run())
    await eventually(lambda: lag.ticks >= 2)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    ticks = lag.ticks
    await asyncio.sleep(0.05)  # twenty-five intervals: a tick left scheduled would have run
    assert lag.ticks == ticks
