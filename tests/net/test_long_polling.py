"""Parked pulls wake on matching arrivals from the store's thread, or time out."""

from __future__ import annotations

import asyncio
import threading

from evq.domain.log import Dispatched
from evq.net.long_polling import PullHolds


def arrival(topic: str, queue_id: int, offset: int, tags_code: int = 0) -> Dispatched:
    return Dispatched(topic, queue_id, offset, 0, 100, tags_code, 0, 0)


def test_a_matching_arrival_from_another_thread_wakes_the_pull() -> None:
    async def main() -> None:
        holds = PullHolds()
        waiting = asyncio.ensure_future(holds.wait("T", 1, 5, timeout_s=10))
        await asyncio.sleep(0)
        assert holds.parked == 1
        threading.Thread(target=holds.on_dispatch, args=([arrival("T", 0, 5),
                                                          arrival("T", 1, 4)],)).start()
        await asyncio.sleep(0.05)
        assert not waiting.done()  # other queue, older offset: still parked
        threading.Thread(target=holds.on_dispatch, args=([arrival("T", 1, 5)],)).start()
        assert await asyncio.wait_for(waiting, 5) is True
        assert holds.parked == 0

    asyncio.run(main())


def test_tag_filter_decides_which_arrival_wakes() -> None:
    async def main() -> None:
        holds = PullHolds()
        waiting = asyncio.ensure_future(
            holds.wait("T", 0, 0, timeout_s=10, tag_filter=lambda code: code == 7))
        await asyncio.sleep(0)
        holds.on_dispatch([arrival("T", 0, 0, tags_code=3)])
        await asyncio.sleep(0.02)
        assert not waiting.done()
        holds.on_dispatch([arrival("T", 0, 1, tags_code=7)])
        assert await asyncio.wait_for(waiting, 5) is True

    asyncio.run(main())


def test_timeout_and_recheck_and_release() -> None:
    async def main() -> None:
        holds = PullHolds()
        assert await holds.wait("T", 0, 0, timeout_s=0.01) is False
        assert holds.parked == 0
        assert await holds.wait("T", 0, 0, timeout_s=10, recheck=lambda: True) is True
        waiting = asyncio.ensure_future(holds.wait("T", 0, 0, timeout_s=10))
        await asyncio.sleep(0)
        holds.release_all()
        assert await asyncio.wait_for(waiting, 5) is False

    asyncio.run(main())
